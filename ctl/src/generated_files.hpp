#pragma once
// Files the generators write (compose, k8s, slurm): YAML in which a string
// that reads like a number or a boolean stays a string, node configs with
// the overrides written in, and files written whole or reported.

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <string>
#include <vector>

namespace consensusd::cli {

// A string that must stay one however it reads ("true", "9100", a hash of
// digits): emitted double-quoted. Tag "!" is what yaml-cpp gives a quoted
// scalar it loads, so quoted values of a loaded document stay quoted too.
YAML::Node str(const std::string& text);

// Block style unless a node asks for flow; ends with a newline.
std::string emit(const YAML::Node& node);

// `--set a.b=VALUE` as a.b in the document (VALUE is YAML; empty is "").
YAML::Node withOverrides(YAML::Node doc, const std::vector<std::string>& overrides);

// Writes a node's config file: `header` (comment lines), then `base` with
// the overrides written in, so one file holds everything the node runs
// with. The overrides are checked first (the schema's errors name the
// flag, exit 78), then the file as the daemon will load it against the
// topology beside it (membership, degree, socket paths), with
// `loadOverrides` on top. Returns the file's text.
std::string writeNodeConfig(const std::filesystem::path& path, const std::string& header,
                            const std::string& base, const std::vector<std::string>& overrides,
                            const std::vector<std::string>& loadOverrides = {});

// Writes `text` to `path`, or throws naming the path.
void writeFile(const std::filesystem::path& path, const std::string& text);

}  // namespace consensusd::cli
