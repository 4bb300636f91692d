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

#[test]
fn torchvision_resnets() {
    assert_eq!(total("resnet18"), 11_689_512);
    assert_eq!(total("resnet34"), 21_797_672);
    assert_eq!(total("resnet50"), 25_557_032);
    assert_eq!(total("resnet101"), 44_549_160);
    assert_eq!(total("resnet152"), 60_192_808);
}
