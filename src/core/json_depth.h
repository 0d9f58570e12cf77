// JSON parsed with a limit on how deep it nests. nlohmann's parser keeps its
// own stack, but dump(), copies and comparisons recurse once per level: a file
// of 100 KB of '[' parsed fine and then overflowed the stack in the error
// message that printed it. Every JSON file a checkpoint or model holds nests a
// few levels (config.json: 3 or 4), so deeper input is refused where it is
// parsed, and whatever is parsed can be printed.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace tpreload::detail {

inline constexpr int kMaxJsonDepth = 64;

// json::parse, throwing json::out_of_range (a json::exception, as a syntax
// error is) for input nested deeper than kMaxJsonDepth.
inline nlohmann::json parse_json(std::string_view text) {
  return nlohmann::json::parse(text, [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxJsonDepth)
      throw nlohmann::json::out_of_range::create(
          409, "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels", nullptr);
    return true;
  });
}

}  // namespace tpreload::detail
