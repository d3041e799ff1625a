#include "keygen_command.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "consensusd/config/load.hpp"
#include "consensusd/daemon/command_line.hpp"
#include "consensusd/daemon/curve.hpp"
#include "consensusd/topology/yaml_io.hpp"

namespace consensusd::cli {
namespace {

struct KeygenOptions {
  std::string file;
  std::string node;
  std::string topology;
  std::string dir;
  std::string output;
};

// Created with mode 0600 and O_EXCL: a secret is never written over, nor
// readable by anyone else for an instant.
void writeSecretFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw UsageError("cannot create " + path + ": " + std::strerror(errno) +
                     (errno == EEXIST ? " (remove it first to replace the key)" : ""));
  }
  const ssize_t written = ::write(fd, text.data(), text.size());
  const bool ok = written == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error("cannot write " + path);
}

int keygenOne(const KeygenOptions& options) {
  const config::CurveKeyPair keys = daemon::curve::generateKeyPair();
  const std::string node =
      options.node.empty() ? std::filesystem::path(options.file).stem().string() : options.node;
  writeSecretFile(options.file, config::keyFileText(node, keys));
  std::cout << "public_key: \"" << keys.publicKey << "\"  # node " << node << "; secret key in "
            << options.file << "\n";
  return kExitOk;
}

int keygenTopology(const KeygenOptions& options) {
  topology::TopologySpec spec = topology::toSpec(topology::loadTopology(options.topology));
  const auto keyFile = [&](const topology::NodeSpec& node) {
    return (std::filesystem::path(options.dir) / (node.id + ".key")).string();
  };
  for (const topology::NodeSpec& node : spec.nodes) {  // all or nothing
    if (std::filesystem::exists(keyFile(node)))
      throw UsageError(keyFile(node) + " exists (remove the old keys first to replace them)");
  }
  std::filesystem::create_directories(options.dir);
  const std::size_t count = spec.nodes.size();
  for (topology::NodeSpec& node : spec.nodes) {
    const config::CurveKeyPair keys = daemon::curve::generateKeyPair();
    writeSecretFile(keyFile(node), config::keyFileText(node.id, keys));
    node.publicKey = keys.publicKey;
  }
  const std::string text =
      topology::toYaml(topology::Topology::fromSpec(std::move(spec), options.topology));
  if (options.output.empty() || options.output == "-") {
    std::cout << text;
  } else {
    std::ofstream out(options.output, std::ios::trunc);
    out << text;
    out.close();
    if (!out) throw std::runtime_error("cannot write " + options.output);
    std::cerr << "wrote " << count << " key pairs to " << options.dir
              << "/ and the topology with their public keys to " << options.output << "\n";
  }
  return kExitOk;
}

}  // namespace

void addKeygenCommand(CLI::App& parent, std::function<int()>& action) {
  auto options = std::make_shared<KeygenOptions>();
  CLI::App* keygen = parent.add_subcommand(
      "keygen", "Create CurveZMQ key pairs (security.curve); secret key files get mode 0600");
  keygen->add_option("file", options->file, "Key file to create (one key pair)");
  keygen->add_option("--node", options->node,
                     "Node id written in the key file (default: FILE's stem)");
  keygen->add_option("--topology", options->topology,
                     "Create a key pair for every node of this topology");
  keygen->add_option("--dir", options->dir, "With --topology: folder for the <id>.key files");
  keygen->add_option(
      "-o,--output", options->output,
      "With --topology: where to write the topology with public keys (default: stdout)");
  keygen->callback([options, &action] {
    action = [options] {
      if (!daemon::curve::available()) throw UsageError("this libzmq was built without CURVE");
      if (options->topology.empty() == options->file.empty())
        throw UsageError("keygen: give either FILE or --topology with --dir");
      if (!options->topology.empty() && options->dir.empty())
        throw UsageError("keygen --topology needs --dir for the secret key files");
      return options->topology.empty() ? keygenOne(*options) : keygenTopology(*options);
    };
  });
}

}  // namespace consensusd::cli
