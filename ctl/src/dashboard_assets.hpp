#pragma once
// The dashboard's page (ctl/dashboard/), compiled into consensusctl so it
// works offline and from any folder.

#include <string_view>

namespace consensusd::cli {

extern const std::string_view kDashboardHtml;
extern const std::string_view kDashboardJs;
extern const std::string_view kDashboardCss;

}  // namespace consensusd::cli
