// LIBSVM and CSV text files. Errors point at FILE:LINE:COL.

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>

#include "consensusd/data/dataset.hpp"

namespace consensusd::data {
namespace {

[[noreturn]] void fail(const std::string& file, std::size_t line, std::size_t column,
                       const std::string& message) {
  throw DataError(file + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " +
                  message);
}

bool parseNumber(const std::string& text, double& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && errno != ERANGE && std::isfinite(out);
}

std::string trim(const std::string& text) {
  const std::size_t first = text.find_first_not_of(" \t\r");
  if (first == std::string::npos) return {};
  const std::size_t last = text.find_last_not_of(" \t\r");
  return text.substr(first, last - first + 1);
}

// Integer labels become classes 0..K-1 in sorted order (-1/+1 -> 0/1);
// any non-integer label makes it a regression problem.
void assignLabels(Dataset& data, const std::vector<double>& raw) {
  const bool integral =
      std::all_of(raw.begin(), raw.end(), [](double v) { return v == std::floor(v); });
  if (!integral) {
    data.targets.resize(static_cast<Eigen::Index>(raw.size()));
    for (std::size_t i = 0; i < raw.size(); ++i)
      data.targets[static_cast<Eigen::Index>(i)] = static_cast<float>(raw[i]);
    return;
  }
  const std::set<double> distinct(raw.begin(), raw.end());
  std::map<double, std::int32_t> classOf;
  for (const double value : distinct)
    classOf.emplace(value, static_cast<std::int32_t>(classOf.size()));
  data.classes = static_cast<int>(std::max<std::size_t>(2, classOf.size()));
  data.labels.reserve(raw.size());
  for (const double value : raw) data.labels.push_back(classOf.at(value));
}

std::ifstream openText(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw DataError(file + ": cannot open file");
  return in;
}

}  // namespace

Dataset readLibsvm(const std::string& file, std::size_t dimension) {
  // The features are held dense: an index decides the allocation, so it is
  // bounded before anything is allocated (a typo of 99999999999 is an error).
  const std::size_t widest = dimension != 0 ? dimension : kMaxLibsvmFeatures;
  std::ifstream in = openText(file);
  struct Entry {
    std::size_t sample;
    std::size_t index;
    float value;
  };
  std::vector<Entry> entries;
  std::vector<double> labels;
  std::size_t largest = 0;
  std::string line;
  for (std::size_t lineNo = 1; std::getline(in, line); ++lineNo) {
    if (const std::size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::size_t at = line.find_first_not_of(" \t\r");
    if (at == std::string::npos) continue;
    std::size_t end = line.find_first_of(" \t\r", at);
    double label = 0;
    if (!parseNumber(line.substr(at, end - at), label))
      fail(file, lineNo, at + 1, "label is not a number");
    const std::size_t sample = labels.size();
    labels.push_back(label);
    std::size_t previous = 0;
    while ((at = line.find_first_not_of(" \t\r", end)) != std::string::npos) {
      end = line.find_first_of(" \t\r", at);
      const std::string token = line.substr(at, end - at);
      const std::size_t colon = token.find(':');
      double index = 0;
      double value = 0;
      if (colon == std::string::npos || !parseNumber(token.substr(0, colon), index) ||
          index != std::floor(index)) {
        fail(file, lineNo, at + 1, "expected INDEX:VALUE, got '" + token + "'");
      }
      if (index < 1 || index > static_cast<double>(widest)) {
        fail(file, lineNo, at + 1,
             "index " + token.substr(0, colon) + " out of range [1, " + std::to_string(widest) +
                 "]");
      }
      if (static_cast<std::size_t>(index) <= previous)
        fail(file, lineNo, at + 1, "indices must increase");
      if (!parseNumber(token.substr(colon + 1), value)) {
        fail(file, lineNo, at + colon + 2,
             "value '" + token.substr(colon + 1) + "' is not a finite number");
      }
      previous = static_cast<std::size_t>(index);
      largest = std::max(largest, previous);
      entries.push_back({sample, previous - 1, static_cast<float>(value)});
    }
  }
  if (labels.empty()) throw DataError(file + ": no samples");
  Dataset data;
  const std::size_t d = dimension != 0 ? dimension : largest;
  if (d > kMaxDenseValues / labels.size()) {
    throw DataError(file + ": " + std::to_string(d) + " features x " +
                    std::to_string(labels.size()) + " samples held dense is more than " +
                    std::to_string(kMaxDenseValues) + " values");
  }
  data.features =
      Eigen::MatrixXf::Zero(static_cast<Eigen::Index>(d), static_cast<Eigen::Index>(labels.size()));
  for (const Entry& e : entries) {
    data.features(static_cast<Eigen::Index>(e.index), static_cast<Eigen::Index>(e.sample)) =
        e.value;
  }
  assignLabels(data, labels);
  return data;
}

Dataset readCsv(const std::string& file, const CsvOptions& options) {
  std::ifstream in = openText(file);
  std::vector<std::vector<float>> rows;
  std::vector<double> labels;
  std::size_t width = 0;
  std::string line;
  for (std::size_t lineNo = 1; std::getline(in, line); ++lineNo) {
    if (trim(line).empty()) continue;
    if (options.header && lineNo == 1) continue;
    std::vector<std::pair<std::string, std::size_t>> fields;  // text, 1-based column
    std::size_t start = 0;
    for (;;) {
      const std::size_t cut = line.find(options.delimiter, start);
      fields.emplace_back(trim(line.substr(start, cut - start)), start + 1);
      if (cut == std::string::npos) break;
      start = cut + 1;
    }
    if (width == 0) width = fields.size();
    if (fields.size() != width) {
      fail(file, lineNo, 1,
           std::to_string(fields.size()) + " fields, expected " + std::to_string(width));
    }
    const int signedWidth = static_cast<int>(width);
    const int labelAt =
        options.labelColumn < 0 ? signedWidth + options.labelColumn : options.labelColumn;
    if (labelAt < 0 || labelAt >= signedWidth) {
      fail(file, lineNo, 1,
           "label column " + std::to_string(options.labelColumn) + " is outside the " +
               std::to_string(width) + " fields");
    }
    std::vector<float> row;
    row.reserve(width - 1);
    for (std::size_t f = 0; f < fields.size(); ++f) {
      double value = 0;
      if (!parseNumber(fields[f].first, value)) {
        fail(file, lineNo, fields[f].second, "non-numeric field '" + fields[f].first + "'");
      }
      if (static_cast<int>(f) == labelAt) {
        labels.push_back(value);
      } else {
        row.push_back(static_cast<float>(value));
      }
    }
    rows.push_back(std::move(row));
  }
  if (rows.empty()) throw DataError(file + ": no samples");
  Dataset data;
  data.features.resize(static_cast<Eigen::Index>(width - 1),
                       static_cast<Eigen::Index>(rows.size()));
  for (std::size_t s = 0; s < rows.size(); ++s) {
    data.features.col(static_cast<Eigen::Index>(s)) = Eigen::Map<const Eigen::VectorXf>(
        rows[s].data(), static_cast<Eigen::Index>(rows[s].size()));
  }
  assignLabels(data, labels);
  return data;
}

}  // namespace consensusd::data
