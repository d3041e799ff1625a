#include "cli.hpp"

#include <iostream>
#include <sstream>

#include "consensusd/data/dataset.hpp"
#include "consensusd/schema/input_error.hpp"
#include "consensusd/topology/generators.hpp"
#include "consensusd/version.hpp"

namespace consensusd::cli {

std::vector<StragglerFlag> stragglerFlags(const std::vector<std::string>& specs,
                                          const topology::Topology& graph, bool allowAll) {
  std::vector<StragglerFlag> flags;
  for (const std::string& spec : specs) {
    const auto eq = spec.find('=');
    const std::string who = spec.substr(0, eq);
    const bool all = allowAll && who == "all";
    const auto index = graph.indexOf(who);
    if (eq == std::string::npos || (!all && !index)) {
      throw UsageError("--straggler '" + spec +
                       "': expected NODE=KEY=VALUE[,KEY=VALUE] with NODE a node of the topology" +
                       (allowAll ? " or all" : ""));
    }
    std::vector<std::string> overrides;
    std::stringstream items(spec.substr(eq + 1));
    for (std::string item; std::getline(items, item, ',');)
      if (!item.empty()) overrides.push_back("straggler." + item);
    for (std::size_t i = 0; i < graph.size(); ++i)
      if (all || i == *index) flags.push_back({i, overrides});
  }
  return flags;
}

void addVersionFlag(CLI::App& app) {
  app.set_version_flag("--version", app.get_name() + " " + kVersion);
}

int run(CLI::App& app, int argc, char** argv, const std::function<int()>& body) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << app.get_name() << ": " << e.what() << " (see --help)\n";
    return kExitUsage;
  }
  try {
    return body();
  } catch (const schema::InputError& e) {
    std::cerr << e.what() << "\n";
    return schema::kExitConfig;
  } catch (const data::DataError& e) {
    std::cerr << e.what() << "\n";
    return kExitData;
  } catch (const topology::GeneratorError& e) {
    std::cerr << app.get_name() << ": " << e.what() << "\n";
    return kExitUsage;
  } catch (const UsageError& e) {
    std::cerr << app.get_name() << ": " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << app.get_name() << ": internal error: " << e.what() << "\n";
    return kExitSoftware;
  }
}

}  // namespace consensusd::cli
