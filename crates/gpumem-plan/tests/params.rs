//! Parameter counts of catalogue models against the real models' published counts.
//! Each expected number was re-derived by hand from the architecture (see the comments).

use gpumem_plan::find_model;

fn total(name: &str) -> u64 {
    find_model(name).unwrap().params().total()
}

#[test]
fn gpt2_family() {
    // wte 50257·768 + wpe 1024·768 + 12 × 7,087,872 + ln_f 1536; lm_head tied.
    assert_eq!(total("gpt2"), 124_439_808);
    assert_eq!(total("gpt2-medium"), 354_823_168);
    assert_eq!(total("gpt2-large"), 774_030_080);
    assert_eq!(total("gpt2-xl"), 1_557_611_200);
}

#[test]
fn encoders_with_pooler() {
    // BertModel: embeddings 23,837,184 + 12 layers 85,054,464 + pooler 590,592.
    assert_eq!(total("bert-base-uncased"), 109_482_240);
    assert_eq!(total("bert-large-uncased"), 335_141_888);
    // RoBERTa: 514 positions, one token type.
    assert_eq!(total("roberta-base"), 124_645_632);
    assert_eq!(total("roberta-large"), 355_359_744);
}

#[test]
fn llama_family_with_gqa_and_untied_heads() {
    assert_eq!(total("llama-2-7b"), 6_738_415_616);
    assert_eq!(total("llama-2-13b"), 13_015_864_320);
    assert_eq!(total("llama-2-70b"), 68_976_648_192);
    assert_eq!(total("meta-llama-3-8b"), 8_030_261_248);
    assert_eq!(total("llama-3-70b"), 70_553_706_496);
    assert_eq!(total("llama-3.2-1b"), 1_235_814_400);
    assert_eq!(total("llama-3.2-3b"), 3_212_749_824);
    assert_eq!(total("mistral-7b"), 7_241_732_096);
    // v0.3 extends the vocabulary to 32768: two more 768-row slices of 4096.
    assert_eq!(total("mistral-7b-v0.3"), 7_248_023_552);
    assert_eq!(total("tinyllama-1.1b"), 1_100_048_384);
}

#[test]
fn qwen_with_qkv_bias_and_moe() {
    assert_eq!(total("qwen2.5-0.5b"), 494_032_768);
    assert_eq!(total("qwen2.5-7b"), 7_615_616_512);
    // 8 experts of 3·4096·14336 per layer plus a 4096×8 router.
    assert_eq!(total("mixtral-8x7b"), 46_702_792_704);
}

#[test]
fn other_decoders() {
    assert_eq!(total("opt-125m"), 125_239_296);
    // OPT-350m projects 512-wide embeddings in and out and has no final LayerNorm.
    assert_eq!(total("opt-350m"), 331_196_416);
    assert_eq!(total("pythia-70m"), 70_426_624);
    assert_eq!(total("pythia-160m"), 162_322_944);
    // Phi-2's untied LM head has a bias.
    assert_eq!(total("phi-2"), 2_779_683_840);
    assert_eq!(total("gemma-2b"), 2_506_172_416);
}

#[test]
fn t5_and_vit() {
    // Shared embedding 16,449,536 + encoder 18,881,280 + decoder 25,175,808 (relative biases included).
    assert_eq!(total("t5-small"), 60_506_624);
    assert_eq!(total("t5-base"), 222_903_552);
    assert_eq!(total("t5-large"), 737_668_096);
    // ViTForImageClassification, 1000 classes: patches 590,592 + cls + 197 positions + body + LN + head.
    assert_eq!(total("vit-base-patch16-224"), 86_567_656);
    assert_eq!(total("vit-large"), 304_326_632);
}

/// T5 v1.1's shape (FLAN-T5), shrunk to 4 + 4 layers and 4096 tokens: a gated GELU MLP and its
/// own LM head, as `from_pretrained` keeps a checkpoint's separate `lm_head.weight` (the
/// transformers 5.23 model built from the config, the head untied: 26,226,048).
#[test]
fn t5_v1_1_keeps_its_own_lm_head() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/plan/configs/flan-t5-small-4l.json"
    );
    let model = gpumem_plan::load_config(std::path::Path::new(path)).unwrap();
    assert_eq!(model.params().total(), 26_226_048);
}

#[test]
fn torchvision_resnets() {
    assert_eq!(total("resnet18"), 11_689_512);
    assert_eq!(total("resnet34"), 21_797_672);
    assert_eq!(total("resnet50"), 25_557_032);
    assert_eq!(total("resnet101"), 44_549_160);
    assert_eq!(total("resnet152"), 60_192_808);
}

#[test]
fn torchvision_vision_transformers() {
    // vit_b_16: conv_proj 3·16²·768 + 768, class token 768, positions 197·768, 12 blocks of
    // 7,087,872 (two LayerNorms, the packed in_proj 3·768² + 3·768, out_proj, MLP 768·3072
    // and back, with biases), final LayerNorm and the 1000-class head 770,536.
    assert_eq!(total("vit_b_16"), 86_567_656);
    // Patches of 32: a 4× larger patch projection, 50 positions.
    assert_eq!(total("vit_b_32"), 88_224_232);
    assert_eq!(total("vit_l_16"), 304_326_632);
    assert_eq!(total("vit_l_32"), 306_535_400);
    // 14-pixel patches on 224 px images: 257 positions of 1280.
    assert_eq!(total("vit_h_14"), 632_045_800);
}

/// Every catalogue model against the count of the real producer: the model built by
/// transformers 5.24 (torchvision for ResNets and Vision Transformers) from the same config on PyTorch's meta device
/// (`gpumem-count-params`, committed as `testdata/plan/param_counts.json`).
#[test]
fn catalogue_matches_the_models_transformers_builds() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/plan/param_counts.json"
    ))
    .unwrap();
    let counts: serde_json::Value = serde_json::from_str(&text).unwrap();
    let counts = counts["models"].as_object().unwrap();
    let names = gpumem_plan::model_names();
    assert_eq!(counts.len(), names.len(), "one count per catalogue model");
    let wrong: Vec<String> = names
        .iter()
        .filter_map(|name| {
            let expected = counts[*name]["parameters"].as_u64().unwrap();
            let planned = total(name);
            (planned != expected).then(|| format!("{name}: planned {planned}, built {expected}"))
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn newer_architectures() {
    // Qwen3: q/k RMSNorm per head, 128-wide heads beside a 1024-wide model, tied.
    assert_eq!(total("qwen3-0.6b"), 596_049_920);
    // 128 routed experts of 3·2048·768 per block, a 2048×128 router.
    assert_eq!(total("qwen3-30b-a3b"), 30_532_122_624);
    // Gemma 2: four norms per block; Gemma 3: plus q/k norms.
    assert_eq!(total("gemma-2-9b"), 9_241_705_984);
    assert_eq!(total("gemma-3-1b"), 999_885_952);
    assert_eq!(total("phi-4"), 14_659_507_200);
    // DeepSeek-V3: latent attention, 3 dense blocks, 256 routed + 1 shared expert.
    assert_eq!(total("deepseek-v3"), 671_026_404_352);
    assert_eq!(total("deepseek-v2-lite"), 15_706_484_224);
    // StarCoder: multi-query attention (one 128-wide key/value head).
    assert_eq!(total("starcoder"), 15_517_456_384);
    assert_eq!(total("mixtral-8x22b"), 140_620_634_112);
    // Whisper: convolutions, a 1500-row encoder position table, k without bias.
    assert_eq!(total("whisper-tiny"), 37_760_640);
    assert_eq!(total("whisper-large-v3"), 1_543_490_560);
    // The vision towers (CLIPVisionModel, SiglipVisionModel).
    assert_eq!(total("clip-vit-large-patch14-vision"), 303_179_776);
    // SigLIP: no class token, attention-pooling head.
    assert_eq!(total("siglip-so400m-patch14-384-vision"), 428_225_600);
    // The dual encoders: CLIP's causal text tower (77 positions), two bias-free projections
    // and the logit scale; SigLIP's text tower with its head, the logit scale and bias.
    assert_eq!(total("clip-vit-base-patch32"), 151_277_313);
    assert_eq!(total("clip-vit-large-patch14"), 427_616_513);
    assert_eq!(total("siglip-base-patch16-224"), 203_155_970);
    assert_eq!(total("siglip-so400m-patch14-384"), 877_960_498);
    // LLaVA-1.5: CLIP ViT-L/14-336 + projector 1024→4096→4096 + Llama 2 with 32064 tokens.
    assert_eq!(total("llava-1.5-7b"), 7_063_427_072);
    // Gemma 3 vision-language: SigLIP-so400m at 896 px without its head, a pooled projector
    // (one 1152×hidden matrix and an RMSNorm) and the Gemma 3 text model (262208 tokens, tied).
    assert_eq!(total("google/gemma-3-4b-it"), 4_300_079_472);
    assert_eq!(total("gemma-3-12b"), 12_187_325_040);
    assert_eq!(total("gemma-3-27b"), 27_432_406_640);
}

#[test]
fn diffusion_denoisers() {
    // SD 1.5: 4 stages of 320-1280 channels, 8 heads, 768-wide text states, conv projections.
    assert_eq!(total("sd-1.5-unet"), 859_520_964);
    assert_eq!(total("runwayml/stable-diffusion-v1-5"), 859_520_964);
    // SD 2.1: 64-wide heads, 1024-wide text states, linear projections.
    assert_eq!(total("sd-2.1-unet"), 865_910_724);
    // SDXL: 3 stages with 1, 2 and 10 transformer blocks per attention, the text-time embedding.
    assert_eq!(total("sdxl-unet"), 2_567_463_684);
    // DiT-XL/2: 28 blocks, each with its own timestep MLP and 1001-row class table.
    assert_eq!(total("dit-xl-2-256"), 749_826_464);
    // The weights of the transformer modules' linears and 1×1 projections, as diffusers builds
    // them (sum of `weight.numel()` over the Linear/Conv2d modules of each Transformer2DModel):
    // SDXL's 10-layer attentions count proj_in/proj_out once per module, not per layer.
    let linear = |name: &str| find_model(name).unwrap().params().block_linear;
    assert_eq!(linear("sd-1.5-unet"), 266_977_280);
    assert_eq!(linear("sdxl-unet"), 2_207_744_000);
}

/// The public diffusers configs committed under `testdata/plan/configs/diffusers/` read as the
/// catalogue's entries do (`gpumem plan --config …/unet/config.json`).
#[test]
fn committed_diffusers_configs_read_as_the_catalogue() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/plan/configs/diffusers"
    );
    for name in ["sd-1.5-unet", "sd-2.1-unet", "sdxl-unet", "dit-xl-2-256"] {
        let path = std::path::Path::new(dir).join(format!("{name}.json"));
        let model = gpumem_plan::load_config(&path).unwrap();
        assert_eq!(model.params().total(), total(name), "{name}");
    }
}

/// Dual-encoder configs as their producers wrote them: Google's SigLIP checkpoints name only
/// what differs from transformers' defaults, and CLIP configs from before transformers 4.22
/// carry their towers as `*_config_dict` beside `null`. Counts from transformers 5.23.
#[test]
fn dual_encoder_configs_take_the_tower_defaults() {
    let count = |text: &str| {
        gpumem_plan::parse_config("config.json", text)
            .unwrap()
            .params()
            .total()
    };
    let siglip_base = r#"{"architectures": ["SiglipModel"], "model_type": "siglip",
        "text_config": {"model_type": "siglip_text_model"},
        "vision_config": {"model_type": "siglip_vision_model", "patch_size": 16}}"#;
    assert_eq!(count(siglip_base), 203_155_970);
    let clip_b32_old = r#"{"architectures": ["CLIPModel"], "model_type": "clip",
        "projection_dim": 512, "text_config": null, "vision_config": null,
        "text_config_dict": {"hidden_size": 512},
        "vision_config_dict": {"patch_size": 32}}"#;
    assert_eq!(count(clip_b32_old), 151_277_313);
}

/// LoRA's trainable parameters equal PEFT's (`get_peft_model(model, LoraConfig(r=16,
/// target_modules=...))`, peft 0.21.2, counted on the meta device): a fused projection
/// (GPT-2's `c_attn`, GPT-NeoX's `query_key_value`, Phi-3's `qkv_proj` and `gate_up_proj`) is
/// one linear with one adapter; an encoder-decoder's names select its decoder's
/// cross-attention linears as well (Whisper's `encoder_attn`, T5's `EncDecAttention`).
#[test]
fn lora_trainable_parameters_match_peft() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/plan/configs/");
    for (config, targets, peft) in [
        ("gpt2-12l", "all-linear", 786_432),
        ("pythia-6l", "all-linear", 786_432),
        ("phi3-4l", "all-linear", 720_896),
        ("tinyllama-8l", "all-linear", 581_632),
        ("whisper-4l", "all-linear", 1_081_344),
        ("whisper-4l", "q_proj,v_proj", 294_912),
        ("t5-small-4l", "all-linear", 1_441_792),
        ("t5-small-4l", "q,v", 393_216),
        ("flan-t5-small-4l", "all-linear", 1_277_952),
    ] {
        let model = gpumem_plan::load_config(std::path::Path::new(&format!("{root}{config}.json")))
            .unwrap();
        let workload = gpumem_plan::Settings {
            lora_rank: Some(16),
            lora_targets: Some(targets.to_string()),
            seq: Some(128),
            ..Default::default()
        }
        .resolve(&model)
        .unwrap()
        .workload;
        let plan = gpumem_plan::estimate(&model, &workload, &Default::default()).unwrap();
        assert_eq!(plan.trainable_params, peft, "{config} {targets}");
    }
}
