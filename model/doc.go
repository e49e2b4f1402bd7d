// Package model is tracegrpo's policy: a Qwen2, Qwen3, Qwen3-MoE or Llama
// decoder built from a Hugging Face config.json, running on any
// kernels.Backend.
//
// # Architectures
//
//   - qwen2 (Qwen2, Qwen2.5, Qwen2.5-Math, DeepSeek-R1-Distill-Qwen): q, k
//     and v projections with biases, no q/k norm, head_dim = hidden/heads
//     unless stated; sliding windows refused.
//   - qwen3: per-head q_norm/k_norm weights before RoPE, no biases.
//   - llama (Llama 2, Llama 3.x): no biases; Llama 3's rope_scaling.
//   - qwen3_moe (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention; sparse
//     MLP layers as transformers' Qwen3MoeSparseMoeBlock (Config.MoE, moe.go):
//     a router without bias, softmax over all experts, the top
//     num_experts_per_tok (ties to the lower expert id), renormalised when
//     norm_topk_prob, SwiGLU experts of width moe_intermediate_size; dense
//     layers where mlp_only_layers and decoder_sparse_step put them. Its
//     load-balancing loss (Model.RouterLoss) is transformers'
//     load_balancing_loss_func; SetRouterLossWeight puts it in the loss.
//     The sparse ops run on the backend's kernels.Experts.
//
// Any other model_type is refused with one line listing these.
//
// # Parameters
//
// NewParamTable lays out every parameter under its HF name
// (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ...,
// model.norm.weight, lm_head.weight unless tie_word_embeddings) in HF order,
// contiguous and without gaps, except that a layer's q, k and v biases sit
// together right after its q, k and v weights, and a sparse layer's experts'
// down_proj weights follow all their gate_proj and up_proj weights (so
// that every expert's gate|up is one (E, 2·Im, C) run and every down one
// (E, C, Im) run). One table drives one flat
// parameter arena (Params) and one gradient arena (Grads) with the same
// layout, so an optimizer, a gradient norm or a checkpoint is one call over
// one buffer. 1-D parameters (norm weights and biases) are exempt from
// weight decay (Param.Decay) under both optimizer styles.
//
// The table is partitioned into ParamGroups, the units of fully sharded
// data parallelism: "embed", one "layers.<N>" per decoder layer (every
// parameter declared inside the layer, whatever its kind), and "head" (the
// final norm and an untied lm_head). Each group lays its parameters out
// again in two flats: the matrices (two or more dimensions: gathered in the
// compute precision) and the vectors (norm weights and biases: fp32), each
// in table order, so fused runs stay adjacent in them.
//
// # RoPE
//
// RopeInvFreq computes the rotary inverse frequencies with transformers'
// float32 arithmetic: plain theta^(−2i/HD), or Llama 3's per-frequency
// rescaling (rope_type "llama3": factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings). New computes the cos/sin tables once
// for Options.MaxSeqLen positions and uploads them; kernels.Ops.Rope reads
// them. Other RoPE types (linear, dynamic, yarn, longrope, ...) are refused
// by name.
//
// # config.json
//
// ParseConfig reads both the transformers v4 form (rope_theta and
// rope_scaling at the top level, torch_dtype) and the v5 form (a
// rope_parameters block, dtype). A config that states both must state the
// same values, or it is refused naming the fields; one that states no theta
// gets transformers' default for its model_type, and Config.Notes says so.
// Config.JSON writes RoPE and the dtype back in the form they were read and
// keeps every key it does not interpret (Config.Extra, and the RoPE block's
// own keys), so a saved checkpoint describes the same model.
//
// # Activations
//
// New sizes every activation once for Options.MaxTokens packed tokens and
// Options.MaxSeqs sequences; Forward and Backward allocate nothing. With
// Options.Recompute only each layer's input is kept and the rest is
// recomputed in Backward (bit-identical results, about one extra forward).
//
// # Alignment
//
// Forward takes a packed micro-batch: tokens (T) and cu_seqlens (S+1), where
// sequence s is tokens[cu[s]:cu[s+1]], attends only within itself and has
// positions restarting at 0. It returns logprob[t] = log p(tokens[t] |
// earlier tokens of its sequence) at a temperature, and the entropy of that
// distribution, with 0 at each sequence's first token. Backward takes
// dL/dlogprob in the same alignment and accumulates (+=) into Grads.
//
// # Sampling
//
// Sampler decodes a batch of prompts with a KV cache (temperature, top-k,
// top-p, stop tokens, seeded by a caller-owned math/rand/v2 PCG) and returns
// each token's logprob under the distribution it was drawn from. Without
// top-k/top-p these equal Forward's logprobs at the same temperature.
//
// # Weights
//
// LoadHF reads model.safetensors or a sharded index (F32, BF16 or F16 widened
// to the fp32 arena) and requires every parameter with its exact shape (a
// sparse layer's experts per expert, as on the Hub, or fused as transformers
// v5 holds them);
// SaveHF writes model.safetensors (format "pt", plus FormatName and
// FormatVersion in its metadata; experts per expert, the Hub's layout) and config.json so that transformers loads
// the directory unchanged. Features the math does not implement (RoPE
// types other than default and llama3, Llama/Qwen3 attention or MLP biases,
// sliding windows, activations other than SiLU) are rejected when the config
// is read, never ignored.
package model
