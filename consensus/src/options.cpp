#include "consensusd/consensus/options.hpp"

namespace consensusd::consensus {

std::optional<MixRound> parseMixRound(const std::string& text) {
  if (text == "newest") return MixRound::Newest;
  if (text == "same") return MixRound::Same;
  return std::nullopt;
}

std::optional<MixMode> parseMixMode(const std::string& text) {
  if (text == "absorb") return MixMode::Absorb;
  if (text == "renormalize") return MixMode::Renormalize;
  if (text == "symmetric") return MixMode::Symmetric;
  return std::nullopt;
}

std::optional<Robust> parseRobust(const std::string& text) {
  if (text == "none") return Robust::None;
  if (text == "clip") return Robust::Clip;
  if (text == "trimmed-mean") return Robust::TrimmedMean;
  return std::nullopt;
}

std::string toString(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::All:
      return "all";
    case PolicyKind::Static:
      return "static";
    case PolicyKind::Timeout:
      return "timeout";
    case PolicyKind::Quantile:
      return "quantile";
    case PolicyKind::Dynamic:
      return "dynamic";
  }
  return "?";
}

std::optional<PolicyKind> parsePolicyKind(const std::string& text) {
  for (const PolicyKind kind : {PolicyKind::All, PolicyKind::Static, PolicyKind::Timeout,
                                PolicyKind::Quantile, PolicyKind::Dynamic}) {
    if (toString(kind) == text) return kind;
  }
  return std::nullopt;
}

}  // namespace consensusd::consensus
