"""Real Hugging Face config.json contents, shrunk so that CPU runs take seconds.

Each entry is the public config.json of a real checkpoint (only the keys that
matter for building the model) plus the overrides that shrink it. The written
file is exactly what the measurement built, so the planner reads the same
numbers (`write_configs`). torchvision models (ResNets, Vision Transformers) use gpumem's
small torchvision JSON.
"""

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

Config = dict[str, Any]

_GPT2: Config = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
    "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_inner": None, "n_layer": 12,
    "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": None,
    "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
    "summary_type": "cls_index", "summary_use_proj": True, "vocab_size": 50257,
}
_TINYLLAMA: Config = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 2048,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 22,
    "num_key_value_heads": 4, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "use_cache": True, "vocab_size": 32000,
}
_LLAMA2_7B: Config = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "use_cache": True, "vocab_size": 32000,
}
_LLAMA2_70B: Config = {
    **_LLAMA2_7B, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
    "num_hidden_layers": 80, "num_key_value_heads": 8,
}
_QWEN25_05B: Config = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}
_BERT_BASE: Config = {
    "architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
    "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
    "num_hidden_layers": 12, "pad_token_id": 0, "position_embedding_type": "absolute",
    "type_vocab_size": 2, "use_cache": True, "vocab_size": 30522,
}
_T5_SMALL: Config = {
    "architectures": ["T5ForConditionalGeneration"], "d_ff": 2048, "d_kv": 64, "d_model": 512,
    "decoder_start_token_id": 0, "dropout_rate": 0.1, "eos_token_id": 1,
    "feed_forward_proj": "relu", "initializer_factor": 1.0, "is_encoder_decoder": True,
    "layer_norm_epsilon": 1e-06, "model_type": "t5", "n_positions": 512, "num_heads": 8,
    "num_layers": 6, "pad_token_id": 0, "relative_attention_num_buckets": 32,
    "vocab_size": 32128,
}
# T5 v1.1's shape, as FLAN-T5 uses it: a gated GELU MLP (wi_0, wi_1), 6 heads of 64 (narrower
# than d_model), an untied LM head.
_FLAN_T5_SMALL: Config = {
    "architectures": ["T5ForConditionalGeneration"], "d_ff": 1024, "d_kv": 64, "d_model": 512,
    "decoder_start_token_id": 0, "dense_act_fn": "gelu_new", "dropout_rate": 0.1,
    "eos_token_id": 1, "feed_forward_proj": "gated-gelu", "initializer_factor": 1.0,
    "is_encoder_decoder": True, "is_gated_act": True, "layer_norm_epsilon": 1e-06,
    "model_type": "t5", "n_positions": 512, "num_decoder_layers": 8, "num_heads": 6,
    "num_layers": 8, "pad_token_id": 0, "relative_attention_max_distance": 128,
    "relative_attention_num_buckets": 32, "tie_word_embeddings": False, "use_cache": True,
    "vocab_size": 32128,
}
_VIT_BASE: Config = {
    "architectures": ["ViTForImageClassification"], "attention_probs_dropout_prob": 0.0,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "hidden_size": 768, "image_size": 224,
    "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-12,
    "model_type": "vit", "num_attention_heads": 12, "num_channels": 3,
    "num_hidden_layers": 12, "patch_size": 16, "qkv_bias": True,
    "id2label": {str(i): f"LABEL_{i}" for i in range(1000)},
}
_OPT_125M: Config = {
    "activation_dropout": 0.0, "activation_function": "relu", "architectures": ["OPTForCausalLM"],
    "attention_dropout": 0.0, "bos_token_id": 2, "do_layer_norm_before": True, "dropout": 0.1,
    "eos_token_id": 2, "ffn_dim": 3072, "hidden_size": 768, "init_std": 0.02, "layerdrop": 0.0,
    "max_position_embeddings": 2048, "model_type": "opt", "num_attention_heads": 12,
    "num_hidden_layers": 12, "pad_token_id": 1, "use_cache": True, "vocab_size": 50272,
    "word_embed_proj_dim": 768,
}
# facebook/opt-350m: post-norm (do_layer_norm_before false), 512-wide embeddings projected to
# the 1024-wide body and back (word_embed_proj_dim).
_OPT_350M: Config = {
    **_OPT_125M, "do_layer_norm_before": False, "ffn_dim": 4096, "hidden_size": 1024,
    "num_attention_heads": 16, "num_hidden_layers": 24, "word_embed_proj_dim": 512,
}
_PYTHIA_70M: Config = {
    "architectures": ["GPTNeoXForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 0,
    "eos_token_id": 0, "hidden_act": "gelu", "hidden_dropout": 0.0, "hidden_size": 512,
    "initializer_range": 0.02, "intermediate_size": 2048, "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048, "model_type": "gpt_neox", "num_attention_heads": 8,
    "num_hidden_layers": 6, "rotary_emb_base": 10000, "rotary_pct": 0.25,
    "tie_word_embeddings": False, "use_cache": True, "use_parallel_residual": True,
    "vocab_size": 50304,
}

# name -> (hub id, real config, shrinking overrides). Attention-probability
# dropout is set to 0 where the real model has it: on CPU, SDPA with dropout
# falls back to the math kernel (materialises seq^2 scores) while GPUs run
# flash / memory-efficient kernels, so only dropout-free attention measures
# GPU-like memory.
HF_CONFIGS: dict[str, tuple[str, Config, Config]] = {
    "gpt2-2l": ("openai-community/gpt2", _GPT2,
                {"n_layer": 2, "n_embd": 256, "n_head": 4, "attn_pdrop": 0.0}),
    "tinyllama-2l": ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", _TINYLLAMA,
                     {"hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 2,
                      "num_attention_heads": 8, "num_key_value_heads": 2}),
    "qwen2.5-2l": ("Qwen/Qwen2.5-0.5B", _QWEN25_05B,
                   {"hidden_size": 448, "intermediate_size": 1216, "num_hidden_layers": 2,
                    "num_attention_heads": 7, "num_key_value_heads": 1, "max_window_layers": 2,
                    "vocab_size": 32768, "bos_token_id": 32767, "eos_token_id": 32767}),
    "bert-2l": ("google-bert/bert-base-uncased", _BERT_BASE,
                {"hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4,
                 "num_hidden_layers": 2, "attention_probs_dropout_prob": 0.0}),
    "t5-small-2l": ("google-t5/t5-small", _T5_SMALL,
                    {"d_model": 256, "d_ff": 1024, "d_kv": 32, "num_layers": 2,
                     "num_decoder_layers": 2}),
    "vit-2l": ("google/vit-base-patch16-224", _VIT_BASE,
               {"hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4,
                "num_hidden_layers": 2}),
    "opt-2l": ("facebook/opt-125m", _OPT_125M,
               {"hidden_size": 256, "ffn_dim": 1024, "num_attention_heads": 4,
                "num_hidden_layers": 2, "word_embed_proj_dim": 256}),
    # OPT-350m's own shape at 4 of its 24 layers (the docs' SDPA benchmark model).
    "opt-350m-4l": ("facebook/opt-350m", _OPT_350M,
                    {"num_hidden_layers": 4, "vocab_size": 4096}),
    "pythia-2l": ("EleutherAI/pythia-70m", _PYTHIA_70M,
                  {"hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4,
                   "num_hidden_layers": 2}),
    # Full-size GPT-2 small (124M), for a trace with real tensor sizes.
    "gpt2": ("openai-community/gpt2", _GPT2, {"attn_pdrop": 0.0}),
    # Deeper variants (real depth, shrunk width).
    "gpt2-12l": ("openai-community/gpt2", _GPT2,
                 {"n_embd": 256, "n_head": 4, "attn_pdrop": 0.0}),
    "tinyllama-8l": ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", _TINYLLAMA,
                     {"hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 8,
                      "num_attention_heads": 8, "num_key_value_heads": 2}),
    "bert-12l": ("google-bert/bert-base-uncased", _BERT_BASE,
                 {"hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4,
                  "attention_probs_dropout_prob": 0.0}),
    # The held-out set (measure_peak.heldout_grid): deeper and wider than the 2-layer
    # configs, with the vocabulary shrunk, so that per-layer memory (the KV cache a forward
    # returns, the attention scores) weighs against the logits as in full-size models.
    "gpt2-8l": ("openai-community/gpt2", _GPT2,
                {"n_layer": 8, "n_embd": 512, "n_head": 8, "vocab_size": 4096,
                 "bos_token_id": 4095, "eos_token_id": 4095, "attn_pdrop": 0.0}),
    # Llama-2-7B's blocks, three of them: gathered blocks as large as the 7B FSDP rows'.
    "llama2-3l": ("meta-llama/Llama-2-7b-hf", _LLAMA2_7B, {"num_hidden_layers": 3}),
    # And two of Llama-2-70B's (the one-GPU FSDP grid, `measure_distributed --device cuda`).
    "llama2-70b-2l": ("meta-llama/Llama-2-70b-hf", _LLAMA2_70B, {"num_hidden_layers": 2}),
    "llama-8l": ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", _TINYLLAMA,
                 {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8,
                  "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 4096}),
    "qwen2.5-6l": ("Qwen/Qwen2.5-0.5B", _QWEN25_05B,
                   {"hidden_size": 448, "intermediate_size": 1216, "num_hidden_layers": 6,
                    "num_attention_heads": 7, "num_key_value_heads": 1, "max_window_layers": 6,
                    "vocab_size": 8192, "bos_token_id": 8191, "eos_token_id": 8191}),
    "opt-6l": ("facebook/opt-125m", _OPT_125M,
               {"hidden_size": 512, "ffn_dim": 2048, "num_attention_heads": 8,
                "num_hidden_layers": 6, "word_embed_proj_dim": 512, "vocab_size": 4096}),
    "pythia-6l": ("EleutherAI/pythia-70m", _PYTHIA_70M,
                  {"hidden_size": 512, "intermediate_size": 2048, "num_attention_heads": 8,
                   "num_hidden_layers": 6, "vocab_size": 4096}),
    "t5-small-4l": ("google-t5/t5-small", _T5_SMALL,
                    {"num_layers": 4, "num_decoder_layers": 4, "vocab_size": 4096}),
    "flan-t5-small-4l": ("google/flan-t5-small", _FLAN_T5_SMALL,
                         {"num_layers": 4, "num_decoder_layers": 4, "vocab_size": 4096}),
    "bert-6l": ("google-bert/bert-base-uncased", _BERT_BASE,
                {"hidden_size": 384, "intermediate_size": 1536, "num_attention_heads": 6,
                 "num_hidden_layers": 6, "vocab_size": 8192,
                 "attention_probs_dropout_prob": 0.0}),
    "vit-4l": ("google/vit-base-patch16-224", _VIT_BASE,
               {"hidden_size": 384, "intermediate_size": 1536, "num_attention_heads": 6,
                "num_hidden_layers": 4}),
}

# The architectures set (measure_peak.architectures_grid): families added to the planner after
# the grids above, each from the published hyperparameters in the planner's catalogue
# (crates/gpumem-plan/data/models.json, whose parameter counts are checked against transformers)
# shrunk the same way: (catalogue name, hub id, overrides).
CATALOGUE = Path("crates/gpumem-plan/data/models.json")
ARCH_CONFIGS: dict[str, tuple[str, str, Config]] = {
    "qwen3-4l": ("qwen3-0.6b", "Qwen/Qwen3-0.6B",
                 {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
                  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
                  "vocab_size": 8192}),
    "qwen3moe-4l": ("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B",
                    {"hidden_size": 512, "intermediate_size": 1536, "moe_intermediate_size": 256,
                     "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
                     "head_dim": 64, "num_experts": 16, "num_experts_per_tok": 4,
                     "vocab_size": 8192}),
    "gemma2-4l": ("gemma-2-2b", "google/gemma-2-2b",
                  {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
                   "query_pre_attn_scalar": 128, "sliding_window": 256, "vocab_size": 8192}),
    "gemma3-6l": ("gemma-3-1b", "google/gemma-3-1b-pt",
                  {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 6,
                   "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128,
                   "query_pre_attn_scalar": 128, "sliding_window": 128, "vocab_size": 8192}),
    "phi3-4l": ("phi-3-mini-4k", "microsoft/Phi-3-mini-4k-instruct",
                {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 4,
                 "num_attention_heads": 12, "num_key_value_heads": 4, "vocab_size": 8192,
                 "pad_token_id": 8191, "bos_token_id": 1, "eos_token_id": 8191}),
    "deepseekv3-4l": ("deepseek-v3", "deepseek-ai/DeepSeek-V3",
                      {"hidden_size": 512, "intermediate_size": 1536, "moe_intermediate_size": 256,
                       "num_hidden_layers": 4, "first_k_dense_replace": 1,
                       "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4,
                       "n_group": 4, "topk_group": 2, "num_attention_heads": 8,
                       "num_key_value_heads": 8, "q_lora_rank": 192, "kv_lora_rank": 128,
                       "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
                       "vocab_size": 8192}),
    "starcoder-4l": ("starcoderbase-1b", "bigcode/starcoderbase-1b",
                     {"n_embd": 768, "n_layer": 4, "n_head": 12, "n_inner": 3072,
                      "n_positions": 2048, "vocab_size": 8192, "attn_pdrop": 0.0}),
    "mixtral-4l": ("mixtral-8x22b", "mistralai/Mixtral-8x22B-v0.1",
                   {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
                    "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 8192}),
    # Whisper reads 3000 log-mel frames (input_features) in its encoder, tokens in its decoder.
    "whisper-4l": ("whisper-tiny", "openai/whisper-tiny",
                   {"vocab_size": 8192, "is_encoder_decoder": True, "decoder_start_token_id": 1,
                    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                    "suppress_tokens": [], "begin_suppress_tokens": []}),
}

# The multimodal set (measure_peak.multimodal_grid): vision towers, a vision-language model and
# Whisper, from the catalogue the same way. A nested override (LLaVA's `text_config`,
# `vision_config`) changes only the keys it names.
MULTIMODAL_CONFIGS: dict[str, tuple[str, str, Config]] = {
    # CLIP ViT-L/14-336's vision tower, 4 layers of width 256: 224 px / 14 = 256 patches + class.
    "clip-vision-4l": ("clip-vit-large-patch14-336-vision", "openai/clip-vit-large-patch14-336",
                       {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
                        "num_attention_heads": 4, "image_size": 224}),
    # SigLIP so400m's vision tower (no class token, attention-pooling head).
    "siglip-vision-4l": ("siglip-so400m-patch14-384-vision", "google/siglip-so400m-patch14-384",
                         {"hidden_size": 288, "intermediate_size": 1088, "num_hidden_layers": 4,
                          "num_attention_heads": 4, "image_size": 224}),
    # The whole dual encoders (CLIPModel, SiglipModel): both towers of width 256 / 288, four
    # layers each, 224 px images; CLIP's text tower causal over 77 positions, SigLIP's over 64.
    "clip-4l": ("clip-vit-large-patch14", "openai/clip-vit-large-patch14",
                {"projection_dim": 128,
                 "text_config": {"hidden_size": 256, "intermediate_size": 1024,
                                 "num_hidden_layers": 4, "num_attention_heads": 4,
                                 "vocab_size": 8192, "projection_dim": 128},
                 "vision_config": {"hidden_size": 256, "intermediate_size": 1024,
                                   "num_hidden_layers": 4, "num_attention_heads": 4,
                                   "projection_dim": 128}}),
    "siglip-4l": ("siglip-so400m-patch14-384", "google/siglip-so400m-patch14-384",
                  {"text_config": {"hidden_size": 288, "intermediate_size": 1088,
                                   "num_hidden_layers": 4, "num_attention_heads": 4,
                                   "vocab_size": 8192},
                   "vision_config": {"hidden_size": 288, "intermediate_size": 1088,
                                     "num_hidden_layers": 4, "num_attention_heads": 4,
                                     "image_size": 224}}),
    # LLaVA-1.5-7B: CLIP tower (feature layer -2) + 2-layer GELU projector + Llama; 256 image
    # tokens per sample (224 px / 14)^2.
    "llava-4l": ("llava-1.5-7b", "llava-hf/llava-1.5-7b-hf",
                 {"image_seq_length": 256, "image_token_index": 8000,
                  "text_config": {"hidden_size": 512, "intermediate_size": 1376,
                                  "num_hidden_layers": 4, "num_attention_heads": 8,
                                  "num_key_value_heads": 8, "vocab_size": 8064},
                  "vision_config": {"hidden_size": 256, "intermediate_size": 1024,
                                    "num_hidden_layers": 4, "num_attention_heads": 4,
                                    "image_size": 224}}),
    # Whisper large-v3 (128 mel bins), 2 + 2 layers of width 256.
    "whisper-v3-2l": ("whisper-large-v3", "openai/whisper-large-v3",
                      {"d_model": 256, "encoder_layers": 2, "decoder_layers": 2,
                       "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                       "encoder_ffn_dim": 1024, "decoder_ffn_dim": 1024, "vocab_size": 8192,
                       "is_encoder_decoder": True, "decoder_start_token_id": 1,
                       "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                       "suppress_tokens": [], "begin_suppress_tokens": []}),
}

# diffusers denoisers (catalogue name, hub id, shrink): the UNets keep their stage layout
# (block types, resnets per stage, transformer blocks per attention, SDXL's text-time
# embedding) at fewer channels; the DiT keeps its blocks at a smaller width.
DIFFUSION_CONFIGS: dict[str, tuple[str, str, Config]] = {
    "sd15-unet-small": ("sd-1.5-unet", "runwayml/stable-diffusion-v1-5",
                        {"block_out_channels": [64, 128, 128, 128], "cross_attention_dim": 128}),
    "sdxl-unet-small": ("sdxl-unet", "stabilityai/stable-diffusion-xl-base-1.0",
                        {"block_out_channels": [64, 128, 256], "attention_head_dim": [2, 4, 8],
                         "transformer_layers_per_block": [1, 2, 3],
                         "cross_attention_dim": 128}),
    "dit-4l": ("dit-xl-2-256", "facebook/DiT-XL-2-256",
               {"num_layers": 4, "num_attention_heads": 4, "attention_head_dim": 32}),
}

# torchvision's models, as gpumem's JSON describes them: a ResNet by its depth, a Vision
# Transformer by its constructor's sizes under its class name (vit_b_16's, 4 of 12 layers).
TORCHVISION_CONFIGS: dict[str, Config] = {
    "resnet18": {"model_type": "resnet", "depth": 18, "num_classes": 1000},
    "resnet50": {"model_type": "resnet", "depth": 50, "num_classes": 1000},
    "vit-b-16-4l": {"architectures": ["VisionTransformer"], "model_type": "vit",
                    "hidden_act": "gelu", "hidden_size": 768, "image_size": 224,
                    "intermediate_size": 3072, "layer_norm_eps": 1e-6,
                    "num_attention_heads": 12, "num_classes": 1000, "num_hidden_layers": 4,
                    "patch_size": 16},
}


def all_names() -> list[str]:
    """Every config name (HF configs, architectures, multimodal, diffusion, then torchvision's)."""
    return [*HF_CONFIGS, *ARCH_CONFIGS, *MULTIMODAL_CONFIGS, *DIFFUSION_CONFIGS,
            *TORCHVISION_CONFIGS]


def _catalogue_config(name: str) -> Config:
    """Catalogue model `name` of the planner (the published hyperparameters of a checkpoint)."""
    from .paths import repo_root
    models = json.loads((repo_root() / CATALOGUE).read_text())["models"]
    return dict(models[name])


def config_dict(name: str) -> Config:
    """The JSON object written for config `name`."""
    if name in TORCHVISION_CONFIGS:
        return dict(TORCHVISION_CONFIGS[name])
    shrunk = {**ARCH_CONFIGS, **MULTIMODAL_CONFIGS, **DIFFUSION_CONFIGS}
    if name in shrunk:
        catalogue_name, hub_id, shrink = shrunk[name]
        real = _catalogue_config(catalogue_name)
    else:
        hub_id, real, shrink = HF_CONFIGS[name]
    out: Config = {"_name_or_path": hub_id, "_gpumem_shrunk": ", ".join(_changes(real, shrink))}
    out.update(real)
    for key, value in shrink.items():
        out[key] = {**real[key], **value} if isinstance(value, dict) else value
    return out


def _changes(real: Config, shrink: Config, prefix: str = "") -> list[str]:
    """`key old->new` for every overridden key (nested ones as `outer.inner`)."""
    out: list[str] = []
    for key, value in shrink.items():
        if isinstance(value, dict):
            out += _changes(real.get(key, {}), value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key} {real.get(key)}->{value}")
    return out


# Model kinds whose forward can build a KV cache (`use_cache`).
KV_CACHE_KINDS = ("causal_lm", "seq2seq", "vlm")


def is_torchvision(cfg: Mapping[str, Any]) -> bool:
    """Whether `cfg` is gpumem's JSON of a torchvision model (a ResNet by its depth, or a
    Vision Transformer under its class name, `VisionTransformer`)."""
    return ((cfg.get("model_type") == "resnet" and "depth" in cfg)
            or cfg.get("architectures", [None])[0] == "VisionTransformer")


def model_kind(cfg: Mapping[str, Any]) -> str:
    """How a config is built and fed (models.build): "torchvision" (a torchvision ResNet or
    Vision Transformer: `model(x)`, cross-entropy on its logits),
    "diffusion" (a diffusers config), "image_cls", "vision_tower" (CLIP/SigLIP vision model),
    "dual_encoder" (CLIPModel/SiglipModel: both towers and the contrastive loss),
    "vlm" (LLaVA: images and text), "masked_lm", "seq2seq" or "causal_lm"; KeyError if it names
    no architecture."""
    if "_class_name" in cfg:
        return "diffusion"
    if is_torchvision(cfg):
        return "torchvision"
    arch = cfg["architectures"][0]
    if arch.endswith("ImageClassification"):
        return "image_cls"
    if arch.endswith("VisionModel"):
        return "vision_tower"
    if arch in ("CLIPModel", "SiglipModel"):
        return "dual_encoder"
    if cfg.get("model_type") == "llava":
        return "vlm"
    if arch.endswith("MaskedLM"):
        return "masked_lm"
    if cfg.get("is_encoder_decoder"):
        return "seq2seq"
    return "causal_lm"


def config_path(config_dir: str | Path, name: str) -> Path:
    return Path(config_dir) / f"{name}.json"


def write_configs(config_dir: str | Path, names: Iterable[str]) -> list[Path]:
    """Write the config files for `names` (idempotent); returns their paths."""
    Path(config_dir).mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for name in names:
        path = config_path(config_dir, name)
        path.write_text(json.dumps(config_dict(name), indent=2, sort_keys=True) + "\n")
        paths.append(path)
    return paths
