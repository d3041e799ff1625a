// The topology file's watch: which changes of its folder it reports.

#include "os/file_watch.hpp"

#include <doctest/doctest.h>
#include <poll.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "config_map_volume.hpp"
#include "process.hpp"

using consensusd::daemon::FileWatch;
using consensusd::testing::ConfigMapVolume;
using consensusd::testing::TempDir;
namespace fs = std::filesystem;

namespace {

// The events reach the inotify queue when the writing call returns; poll
// with no wait says whether the loop would wake.
bool wakes(const FileWatch& watch) {
  pollfd item{watch.fd(), POLLIN, 0};
  return ::poll(&item, 1, 0) == 1;
}

std::string read(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("a file written in place wakes the watch once it is closed") {
  TempDir dir;
  const std::string file = dir.write("topology.yaml", "one\n");
  FileWatch watch(file);
  CHECK_FALSE(wakes(watch));
  CHECK_FALSE(watch.changed());
  {
    std::ofstream out(file);
    out << "two\n";
    out.flush();
  }
  CHECK(wakes(watch));
  CHECK(watch.changed());
  CHECK_FALSE(watch.changed());  // drained
  CHECK_FALSE(wakes(watch));
}

TEST_CASE("a file renamed into place (editors, tools) wakes the watch; reading does not") {
  TempDir dir;
  const std::string file = dir.write("topology.yaml", "one\n");
  FileWatch watch(file);
  dir.write(".topology.yaml.swp", "two\n");
  CHECK(watch.changed());  // the editor's own file, closed: a read finds the old text
  fs::rename(dir.path() + "/.topology.yaml.swp", file);
  CHECK(watch.changed());
  CHECK(read(file) == "two\n");
  CHECK_FALSE(watch.changed());  // reading is no change
}

TEST_CASE("a ConfigMap volume's update wakes the watch, and the file reads the new text") {
  TempDir dir;
  ConfigMapVolume volume(dir.path());
  volume.update({{"topology.yaml", "ring of 8\n"}, {"node-0.yaml", "n0\n"}});
  const std::string file = dir.path() + "/topology.yaml";
  FileWatch watch(file);
  CHECK(read(file) == "ring of 8\n");
  volume.update({{"topology.yaml", "ring of 10\n"}, {"node-0.yaml", "n0\n"}});
  CHECK(wakes(watch));
  CHECK(watch.changed());
  CHECK(read(file) == "ring of 10\n");
  CHECK_FALSE(fs::exists(dir.path() + "/..data_tmp"));
}

TEST_CASE("a folder that cannot be watched is an error at once") {
  TempDir dir;
  CHECK_THROWS_AS(FileWatch(dir.path() + "/gone/topology.yaml"), std::system_error);
}
