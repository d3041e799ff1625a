#include "consensusd/daemon/command_line.hpp"

#include <iostream>

#include "consensusd/data/dataset.hpp"
#include "consensusd/schema/input_error.hpp"
#include "consensusd/topology/generators.hpp"
#include "consensusd/version.hpp"

namespace consensusd::cli {

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
