# Warnings and sanitizers as INTERFACE targets that every module links
# PRIVATE, so flags never leak to consumers and presets choose sanitizers.

add_library(consensusd_warnings INTERFACE)
add_library(consensusd::warnings ALIAS consensusd_warnings)
target_compile_options(consensusd_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
  -Wcast-align -Woverloaded-virtual -Wconversion -Wsign-conversion
  -Wdouble-promotion -Wformat=2 -Wimplicit-fallthrough)
option(CONSENSUSD_WERROR "Treat warnings as errors" OFF)
if(CONSENSUSD_WERROR)
  target_compile_options(consensusd_warnings INTERFACE -Werror)
endif()

set(CONSENSUSD_SANITIZERS "" CACHE STRING
    "Comma-separated sanitizers: address,undefined | thread | empty")
add_library(consensusd_sanitizers INTERFACE)
add_library(consensusd::sanitizers ALIAS consensusd_sanitizers)
if(CONSENSUSD_SANITIZERS)
  target_compile_options(consensusd_sanitizers INTERFACE
    -fsanitize=${CONSENSUSD_SANITIZERS} -fno-omit-frame-pointer
    -fno-sanitize-recover=all)
  target_link_options(consensusd_sanitizers INTERFACE
    -fsanitize=${CONSENSUSD_SANITIZERS})
endif()

# One call per module target: warnings + sanitizers, PRIVATE.
function(consensusd_target_defaults target)
  target_link_libraries(${target} PRIVATE consensusd::warnings consensusd::sanitizers)
endfunction()
