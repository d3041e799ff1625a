#pragma once
// A folder updated as the kubelet updates a ConfigMap volume (its
// AtomicWriter): the files go into a new hidden timestamped folder, a
// `..data_tmp` symlink to it is renamed over `..data`, each visible name is
// a symlink through `..data`, and the old folder is removed. A reader sees
// the old files or the new ones, never a mix; no visible name is written.

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace consensusd::testing {

class ConfigMapVolume {
 public:
  explicit ConfigMapVolume(std::filesystem::path folder) : folder_(std::move(folder)) {
    std::filesystem::create_directories(folder_);
  }

  void update(const std::map<std::string, std::string>& files) {
    namespace fs = std::filesystem;
    const std::string version = "..2026_12_05_00_00_00." + std::to_string(++updates_);
    fs::create_directory(folder_ / version);
    for (const auto& [name, text] : files) std::ofstream(folder_ / version / name) << text;
    const fs::path data = folder_ / "..data";
    const fs::path old = fs::is_symlink(data) ? fs::read_symlink(data) : fs::path();
    fs::create_symlink(version, folder_ / "..data_tmp");
    fs::rename(folder_ / "..data_tmp", data);
    for (const auto& entry : files) {
      if (!fs::is_symlink(folder_ / entry.first))
        fs::create_symlink(fs::path("..data") / entry.first, folder_ / entry.first);
    }
    if (!old.empty()) fs::remove_all(folder_ / old);
  }

 private:
  std::filesystem::path folder_;
  int updates_ = 0;
};

}  // namespace consensusd::testing
