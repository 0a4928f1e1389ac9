#ifndef MUONSHARD_TESTS_SIM_XML_CHECK_H_
#define MUONSHARD_TESTS_SIM_XML_CHECK_H_

// A small well-formedness check of the SVG the simulator writes (no XML
// parser in the dependencies): one root element, every tag closed in order,
// attribute values quoted, no raw '<' in text and every '&' an entity.

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace muonshard::testing {

inline bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
         c == ':' || c == '.';
}

// "" when well formed, else what is wrong and where.
inline std::string CheckWellFormedXml(const std::string& xml) {
  std::vector<std::string> open;
  int roots = 0;
  size_t i = 0;
  if (absl::StartsWith(xml, "<?xml")) i = xml.find("?>") + 2;
  while (i < xml.size()) {
    if (xml[i] != '<') {
      if (xml[i] == '&') {
        const size_t semi = xml.find(';', i);
        if (semi == std::string::npos || semi - i > 6) return absl::StrCat("bare '&' at ", i);
      }
      if (open.empty() && xml[i] != '\n' && xml[i] != ' ') return absl::StrCat("text outside the root at ", i);
      ++i;
      continue;
    }
    const size_t end = xml.find('>', i);
    if (end == std::string::npos) return absl::StrCat("unclosed tag at ", i);
    std::string tag = xml.substr(i + 1, end - i - 1);
    i = end + 1;
    if (!tag.empty() && tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return absl::StrCat("</", tag.substr(1), "> closes nothing");
      open.pop_back();
      continue;
    }
    const bool self_closing = !tag.empty() && tag.back() == '/';
    size_t n = 0;
    while (n < tag.size() && IsNameChar(tag[n])) ++n;
    if (n == 0) return absl::StrCat("bad tag <", tag, ">");
    int quotes = 0;
    for (char c : tag) {
      if (c == '"') ++quotes;
      if (c == '<') return absl::StrCat("'<' inside <", tag, ">");
    }
    if (quotes % 2 != 0) return absl::StrCat("unbalanced quotes in <", tag, ">");
    if (open.empty()) ++roots;
    if (!self_closing) open.push_back(tag.substr(0, n));
  }
  if (!open.empty()) return absl::StrCat("<", open.back(), "> is never closed");
  if (roots != 1) return absl::StrCat(roots, " root elements");
  return "";
}

// Occurrences of `needle` in `text`.
inline int CountOf(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace muonshard::testing

#endif  // MUONSHARD_TESTS_SIM_XML_CHECK_H_
