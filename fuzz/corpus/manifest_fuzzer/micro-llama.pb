
tiny-llama-micro#
model.embed_tokens.weight€€0
&model.layers.0.self_attn.q_proj.weight€€0
&model.layers.0.self_attn.k_proj.weight€€0
&model.layers.0.self_attn.v_proj.weight€€0
&model.layers.0.self_attn.o_proj.weight€€-
#model.layers.0.mlp.gate_proj.weight°€+
!model.layers.0.mlp.up_proj.weight°€-
#model.layers.0.mlp.down_proj.weight€°-
%model.layers.0.input_layernorm.weight€6
.model.layers.0.post_attention_layernorm.weight€
model.norm.weight€
lm_head.weight€€