#ifndef MUONSHARD_TESTS_SIM_TP_DECODER_MANIFEST_H_
#define MUONSHARD_TESTS_SIM_TP_DECODER_MANIFEST_H_

// The small tensor-parallel decoder the simulator tests plan: a dense
// decoder marked as Megatron splits it (q/up column, o/down row) with a
// replicated Muon matrix (mixer) per layer, 3 layers.

#include <string>

#include "muonshard/v1/manifest.pb.h"
#include "tests/testing/manifest_builder.h"

namespace muonshard::testing {

inline v1::ModelManifest TpDecoderManifest() {
  ManifestBuilder b("tp");
  b.Add("model.embed_tokens.weight", {512, 64});
  for (int l = 0; l < 3; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    b.Add(p + "self_attn.q_proj.weight", {64, 64})
        .Add(p + "self_attn.o_proj.weight", {64, 64})
        .Add(p + "mlp.up_proj.weight", {128, 64})
        .Add(p + "mlp.down_proj.weight", {64, 128})
        .Add(p + "mlp.mixer.weight", {64, 64})
        .Add(p + "input_layernorm.weight", {64});
  }
  v1::ModelManifest m = b.Build();
  for (v1::TensorSpec& t : *m.mutable_tensors()) {
    const std::string& n = t.name();
    if (n.find("q_proj") != std::string::npos || n.find("up_proj") != std::string::npos) t.set_tp_split(v1::TP_COLUMN);
    if (n.find("o_proj") != std::string::npos || n.find("down_proj") != std::string::npos) t.set_tp_split(v1::TP_ROW);
  }
  return m;
}

}  // namespace muonshard::testing

#endif  // MUONSHARD_TESTS_SIM_TP_DECODER_MANIFEST_H_
