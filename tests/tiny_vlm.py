"""Tiny vision-language models built from configs (Qwen2-VL, Qwen2.5-VL, LLaVA) and batches for them: image samples
with the models' own placeholder tokens, text-only samples, and a collator that mixes both in one batch."""

import torch

VOCAB = 96
IMAGE, VIDEO, VISION_START, VISION_END = 90, 91, 92, 93
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "llava")
_TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
# Qwen: 4x4-pixel patches, 2 frames, 2x2 merge; one image is a 4x4 grid of patches -> 4 placeholder tokens
_QWEN_VISION = dict(depth=2, hidden_size=32, num_heads=4, patch_size=4, spatial_merge_size=2, temporal_patch_size=2,
                    in_channels=3)
QWEN_GRID = (1, 4, 4)
# LLaVA: CLIP at 16x16 pixels in 4x4 patches -> 16 placeholder tokens (the CLS feature dropped)
LLAVA_SIZE = 16


def build(family: str):
    """A tiny ``family`` model (random weights from seed 0) for conditional generation."""
    import transformers

    torch.manual_seed(0)
    if family == "llava":
        config = transformers.LlavaConfig(
            vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, image_size=LLAVA_SIZE, patch_size=4),
            text_config=dict(model_type="llama", **_TEXT), image_token_id=IMAGE, projector_hidden_act="gelu")
        return transformers.LlavaForConditionalGeneration(config)
    rope = {"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0}
    tokens = dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VISION_START,
                  vision_end_token_id=VISION_END)
    if family == "qwen2_vl":
        config = transformers.Qwen2VLConfig(text_config={**_TEXT, "rope_parameters": rope},
                                            vision_config={**_QWEN_VISION, "embed_dim": 32}, **tokens)
        return transformers.Qwen2VLForConditionalGeneration(config)
    if family == "qwen2_5_vl":
        config = transformers.Qwen2_5_VLConfig(
            text_config={**_TEXT, "rope_parameters": rope}, **tokens,
            vision_config={**_QWEN_VISION, "intermediate_size": 64, "out_hidden_size": 32, "window_size": 16,
                           "fullatt_block_indexes": [1]})
        return transformers.Qwen2_5_VLForConditionalGeneration(config)
    raise ValueError(family)


def sample(family: str, image: bool, seed: int) -> dict:
    """One training sample: text tokens (ids 3-18, learnable) around the family's image placeholders when ``image``."""
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(3, 19, (12,), generator=g)
    if not image:
        return {"input_ids": text, "labels": text.clone()}
    if family == "llava":
        placeholders = torch.full(((LLAVA_SIZE // 4) ** 2,), IMAGE)
        ids = torch.cat([text[:2], placeholders, text[2:]])
        pixels = torch.randn(1, 3, LLAVA_SIZE, LLAVA_SIZE, generator=g)
        return {"input_ids": ids, "labels": ids.masked_fill(ids == IMAGE, -100), "pixel_values": pixels}
    t, h, w = QWEN_GRID
    placeholders = torch.full((t * h * w // 4,), IMAGE)
    ids = torch.cat([text[:2], torch.tensor([VISION_START]), placeholders, torch.tensor([VISION_END]), text[2:]])
    pixels = torch.randn(t * h * w, 3 * 2 * 4 * 4, generator=g)
    return {"input_ids": ids, "labels": ids.masked_fill(ids == IMAGE, -100), "pixel_values": pixels,
            "image_grid_thw": torch.tensor([QWEN_GRID]), "mm_token_type_ids": (ids == IMAGE).long()}


def collate(samples: list) -> dict:
    """Right-pads token rows (labels with -100) and stacks the images of the samples that have them; a batch without
    images has no vision keys at all, as a processor's text-only batch."""
    longest = max(len(s["input_ids"]) for s in samples)

    def pad(key, value):
        return torch.stack([torch.cat([s[key], torch.full((longest - len(s[key]),), value)]) for s in samples])

    batch = {"input_ids": pad("input_ids", 0), "labels": pad("labels", -100),
             "attention_mask": torch.stack([torch.cat([torch.ones(len(s["input_ids"]), dtype=torch.long),
                                                       torch.zeros(longest - len(s["input_ids"]), dtype=torch.long)])
                                            for s in samples])}
    with_images = [s for s in samples if "pixel_values" in s]
    if with_images:
        batch["pixel_values"] = torch.cat([s["pixel_values"] for s in with_images])
        if "image_grid_thw" in with_images[0]:
            batch["image_grid_thw"] = torch.cat([s["image_grid_thw"] for s in with_images])
            batch["mm_token_type_ids"] = torch.stack([
                torch.cat([s.get("mm_token_type_ids", torch.zeros_like(s["input_ids"])),
                           torch.zeros(longest - len(s["input_ids"]), dtype=torch.long)]) for s in samples])
    return batch
