#include "importer/ns_blocks_rules.h"

#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/ns_blocks.h"
#include "re2/re2.h"

namespace muonshard::importer {
namespace {

// How much of a rule or a name a message quotes.
constexpr size_t kQuoted = 200;

std::string Quoted(absl::string_view text) {
  return absl::StrCat("\"", text.substr(0, kQuoted), text.size() > kQuoted ? "...\"" : "\"");
}

absl::Status RuleError(absl::string_view rule, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("ns_blocks rule ", Quoted(rule), ": ", what));
}

struct CompiledRule {
  NsBlocksRule rule;
  std::unique_ptr<RE2> regex;
  bool matched = false;
};

absl::StatusOr<std::vector<CompiledRule>> Compile(const std::vector<std::string>& rules) {
  std::vector<CompiledRule> out;
  for (const std::string& text : rules) {
    CompiledRule c;
    MUONSHARD_ASSIGN_OR_RETURN(c.rule, ParseNsBlocksRule(text));
    c.regex = std::make_unique<RE2>(c.rule.pattern, RE2::Quiet);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

absl::StatusOr<NsBlocksRule> ParseNsBlocksRule(absl::string_view rule) {
  const size_t eq = rule.rfind('=');
  if (eq == absl::string_view::npos) {
    return RuleError(rule, "expected REGEX=BLOCKS (e.g. '.*\\.qkv_proj\\.weight=rows:3072,1024,1024')");
  }
  NsBlocksRule out;
  out.text = std::string(rule);
  out.pattern = std::string(absl::StripAsciiWhitespace(rule.substr(0, eq)));
  if (out.pattern.empty()) return RuleError(rule, "the regex before '=' is empty");
  RE2 re(out.pattern, RE2::Quiet);
  if (!re.ok()) return RuleError(rule, absl::StrCat("not a valid regex: ", re.error()));
  absl::StatusOr<v1::NsBlocks> blocks = planner::ParseNsBlocks(rule.substr(eq + 1));
  if (!blocks.ok()) return RuleError(rule, blocks.status().message());
  out.blocks = *std::move(blocks);
  return out;
}

absl::Status ApplyNsBlocksRules(const std::vector<std::string>& rules, v1::ModelManifest* manifest) {
  if (rules.empty()) return absl::OkStatus();
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<CompiledRule> compiled, Compile(rules));
  std::vector<const CompiledRule*> chosen(manifest->tensors_size(), nullptr);
  for (int i = 0; i < manifest->tensors_size(); ++i) {
    const v1::TensorSpec& t = manifest->tensors(i);
    for (CompiledRule& c : compiled) {
      if (!RE2::FullMatch(t.name(), *c.regex)) continue;
      if (chosen[i] != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", Quoted(t.name()), ": matched by ns_blocks rules ",
                                                       Quoted(chosen[i]->rule.text), " and ", Quoted(c.rule.text)));
      }
      chosen[i] = &c;
      c.matched = true;
      absl::Status s = planner::CheckNsBlocks(c.rule.blocks, t.shape());
      if (!s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", Quoted(t.name()), " (ns_blocks rule ", Quoted(c.rule.text), "): ", s.message()));
      }
    }
  }
  for (const CompiledRule& c : compiled) {
    if (!c.matched) return RuleError(c.rule.text, "matches no tensor (the regex must match the whole name)");
  }
  for (int i = 0; i < manifest->tensors_size(); ++i) {
    if (chosen[i] != nullptr) *manifest->mutable_tensors(i)->mutable_ns_blocks() = chosen[i]->rule.blocks;
  }
  return absl::OkStatus();
}

}  // namespace muonshard::importer
