// Package model is tracegrpo's policy: a Qwen3 or Llama decoder built from a
// Hugging Face config.json, running on any kernels.Backend.
//
// # Parameters
//
// NewParamTable lays out every parameter under its HF name
// (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ...,
// model.norm.weight, lm_head.weight unless tie_word_embeddings) in HF order,
// contiguous and without gaps. One table drives one flat parameter arena
// (Params) and one gradient arena (Grads) with the same layout, so an
// optimizer, a gradient norm or a checkpoint is one call over one buffer.
// Norm weights are exempt from weight decay (Param.Decay); Qwen3 adds
// per-head q_norm/k_norm weights before RoPE; neither architecture has biases.
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
// to the fp32 arena) and requires every parameter with its exact shape;
// SaveHF writes model.safetensors (format "pt", plus FormatName and
// FormatVersion in its metadata) and config.json so that transformers loads
// the directory unchanged. Features the math does not implement (rope_scaling,
// attention or MLP biases, sliding windows, activations other than SiLU) are
// rejected when the config is read, never ignored.
package model
