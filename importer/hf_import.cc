#include "importer/hf_import.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "importer/internal/blocks.h"
#include "importer/internal/families.h"
#include "importer/internal/hf_config.h"
#include "importer/ns_blocks_rules.h"

namespace muonshard::importer {
namespace {

using internal::HfConfig;

// What a family's checkpoints may have beyond the decoder (Family.parts).
enum FamilyPart : unsigned {
  kMtp = 1,  // next-n prediction layers (--mtp)
  kMla = 2,  // multi-head latent attention, kv_b_proj (--ns-blocks-mla)
};

struct Family {
  const char* model_type;
  internal::FamilyBuilder build;
  unsigned parts;  // FamilyPart bits
};

// Sorted by model_type. kimi_k2 is DeepSeek-V3's architecture under its own
// model_type (its config names DeepseekV3ForCausalLM); gemma3 is the
// multimodal Gemma 3, of which only the language model is imported.
constexpr Family kFamilies[] = {
    {"deepseek_v3", internal::BuildDeepseekV3, kMtp | kMla},
    {"ernie4_5_moe", internal::BuildErnie45Moe, 0},
    {"falcon", internal::BuildFalcon, 0},
    {"gemma2", internal::BuildGemma2, 0},
    {"gemma3", internal::BuildGemma3, 0},
    {"gemma3_text", internal::BuildGemma3Text, 0},
    {"gpt_neox", internal::BuildGptNeox, 0},
    {"gpt_oss", internal::BuildGptOss, 0},
    {"kimi_k2", internal::BuildDeepseekV3, kMtp | kMla},
    {"llama", internal::BuildLlama, 0},
    {"mistral", internal::BuildMistral, 0},
    {"mixtral", internal::BuildMixtral, 0},
    {"olmoe", internal::BuildOlmoe, 0},
    {"phi3", internal::BuildPhi3, 0},
    {"qwen2", internal::BuildQwen2, 0},
    {"qwen2_moe", internal::BuildQwen2Moe, 0},
    {"qwen3_moe", internal::BuildQwen3Moe, 0},
};

absl::StatusOr<const Family*> FindFamily(const std::string& model_type) {
  for (const Family& family : kFamilies) {
    if (model_type == family.model_type) return &family;
  }
  return absl::InvalidArgumentError(absl::StrCat("config.json: unknown model_type \"", model_type,
                                                 "\" (supported: ", absl::StrJoin(SupportedModelTypes(), ", "), ")"));
}

// transformers writes `torch_dtype` (v4) or `dtype` (v5).
absl::StatusOr<v1::DType> ReadDType(const HfConfig& config) {
  const char* key = config.Has("torch_dtype") ? "torch_dtype" : "dtype";
  MUONSHARD_ASSIGN_OR_RETURN(std::string name, config.StringOr(key, "bfloat16"));
  if (name == "bfloat16") return v1::BF16;
  if (name == "float16") return v1::FP16;
  if (name == "float32") return v1::FP32;
  return internal::FieldError(key, absl::StrCat("is \"", name, "\", not one of bfloat16, float16, float32"));
}

absl::StatusOr<std::string> ModelName(const HfConfig& config, const ImportOptions& options,
                                      const std::string& model_type) {
  if (!options.name.empty()) return options.name;
  MUONSHARD_ASSIGN_OR_RETURN(std::string path, config.StringOr("_name_or_path", ""));
  absl::string_view trimmed = absl::StripSuffix(path, "/");
  absl::string_view last = trimmed.substr(trimmed.find_last_of('/') + 1);
  if (!last.empty()) return std::string(last);
  if (!options.default_name.empty()) return options.default_name;
  return model_type;
}

}  // namespace

std::vector<std::string> SupportedModelTypes() {
  std::vector<std::string> types;
  for (const Family& family : kFamilies) types.emplace_back(family.model_type);
  return types;
}

bool LooksLikeHfConfig(absl::string_view json, std::string* model_type) {
  absl::StatusOr<HfConfig> config = HfConfig::Parse(json);
  if (!config.ok() || config->Has("tensors")) return false;
  absl::StatusOr<std::string> type = config->String("model_type");
  if (!type.ok()) return false;
  if (model_type != nullptr) *model_type = *std::move(type);
  return true;
}

absl::StatusOr<v1::ModelManifest> ImportHfConfig(absl::string_view config_json, const ImportOptions& options) {
  MUONSHARD_ASSIGN_OR_RETURN(HfConfig config, HfConfig::Parse(config_json));
  MUONSHARD_ASSIGN_OR_RETURN(std::string model_type, config.String("model_type"));
  MUONSHARD_ASSIGN_OR_RETURN(const Family* family, FindFamily(model_type));
  if (options.mtp && (family->parts & kMtp) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mtp: model_type \"", model_type, "\" has no next-n prediction layers"));
  }
  if (options.ns_blocks_mla && (family->parts & kMla) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--ns-blocks-mla: model_type \"", model_type,
                                                   "\" has no multi-head latent attention (kv_b_proj)"));
  }
  MUONSHARD_ASSIGN_OR_RETURN(v1::DType dtype, ReadDType(config));
  v1::ModelManifest manifest;
  MUONSHARD_ASSIGN_OR_RETURN(*manifest.mutable_model(), ModelName(config, options, model_type));
  internal::TensorList tensors(dtype, &manifest);
  internal::FamilyOptions family_options;
  family_options.mtp = options.mtp;
  family_options.mla_head_blocks = options.ns_blocks_mla;
  MUONSHARD_RETURN_IF_ERROR(family->build(config, family_options, &tensors));
  MUONSHARD_RETURN_IF_ERROR(ApplyNsBlocksRules(options.ns_blocks, &manifest));
  return manifest;
}

}  // namespace muonshard::importer
