#include "train_command.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>

#include "consensusd/config/load.hpp"
#include "consensusd/config/params.hpp"
#include "consensusd/daemon/command_line.hpp"

namespace consensusd::cli {
namespace {

struct TrainOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string csv;
  bool quiet = false;
};

int runTrain(const TrainOptions& options) {
  const config::LoadedConfig loaded = config::loadConfig(options.config, options.overrides);
  const config::NodeConfig& cfg = loaded.config;
  const data::TrainTest data = data::load(config::dataSource(cfg));
  const data::LocalTrainOptions trainOptions = config::localTrainOptions(cfg, data.train);
  std::cerr << data.description << "\n"
            << "model " << cfg.model.kind << " (" << cfg.model.dtype << "), batch "
            << cfg.train.batchSize << ", learning rate " << cfg.train.learningRate << " ("
            << cfg.train.schedule << "), "
            << (cfg.train.rounds > 0 ? std::to_string(cfg.train.rounds) + " rounds"
                                     : std::string("no round limit"))
            << "\n";

  std::unique_ptr<std::ofstream> csv;
  if (!options.csv.empty()) {
    csv = std::make_unique<std::ofstream>(options.csv, std::ios::trunc);
    if (!*csv) throw std::runtime_error("cannot write " + options.csv);
    *csv << "round,epoch,elapsed_s,train_loss,test_loss,test_accuracy,grad_norm_sq,sample_variance,"
            "samples_per_s\n";
  }
  const auto onEval = [&](const data::TrainPoint& p) {
    if (!options.quiet) {
      std::fprintf(stderr,
                   "round %7lld  epoch %3zu  loss %.4f  test loss %.4f  test acc %.4f  %8.0f "
                   "samples/s  %6.1f s\n",
                   static_cast<long long>(p.round), p.epoch, p.trainLoss, p.testLoss,
                   p.testAccuracy, p.samplesPerSecond, p.elapsedS);
    }
    if (csv) {
      *csv << p.round << ',' << p.epoch << ',' << p.elapsedS << ',' << p.trainLoss << ','
           << p.testLoss << ',' << p.testAccuracy << ',' << p.gradNormSq << ',' << p.sampleVariance
           << ',' << p.samplesPerSecond << '\n';
    }
  };
  const data::TrainResult result = config::usesFloat64(cfg)
                                       ? data::trainLocal<double>(data, trainOptions, onEval)
                                       : data::trainLocal<float>(data, trainOptions, onEval);
  const data::TrainPoint& last = result.curve.back();
  std::printf("final: round %lld, epoch %zu, test accuracy %.4f, test loss %.4f, %.1f s\n",
              static_cast<long long>(last.round), last.epoch, last.testAccuracy, last.testLoss,
              last.elapsedS);
  return kExitOk;
}

}  // namespace

void addTrainCommand(CLI::App& parent, std::function<int()>& action) {
  auto options = std::make_shared<TrainOptions>();
  CLI::App* train = parent.add_subcommand(
      "train", "Single-node SGD on a node config's data and model (no consensus)");
  train->add_option("-c,--config", options->config, "Node config file")->required();
  train->add_option("--set", options->overrides, "Override a config key (repeatable)")
      ->type_name("KEY=VALUE");
  train->add_option("--csv", options->csv, "Write the learning curve (one row per evaluation)");
  train->add_flag("-q,--quiet", options->quiet, "Only the final line");
  train->callback([options, &action] { action = [options] { return runTrain(*options); }; });
}

}  // namespace consensusd::cli
