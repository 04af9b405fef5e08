// Per-cause detectors and normalisers (one file each: cause_<name>.cpp), dispatched by causes.cpp.
#pragma once
#include <cstdint>
#include <string_view>

#include "analyze/causes.h"

namespace kvpack::analyze {

Detection detect_volatile(const Log& log);
Log normalise_volatile(Log log);

Detection detect_tool_order(const Log& log);
Log normalise_tool_order(Log log);

Detection detect_whitespace(const Log& log);
Log normalise_whitespace_log(Log log);

// Detection and normalisation come from the same matching: a request is flagged when it was re-anchored.
struct Reanchored {
  Log log;
  Detection detection;
};
Reanchored reanchor_history(const Log& log);

Detection detect_document_order(const Log& log);
Log normalise_document_order(Log log);

uint64_t text_hash(std::string_view s);

}  // namespace kvpack::analyze
