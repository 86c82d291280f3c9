"""Inputs as people give them, encoded for the model: raw texts through the tokenizer
(`encode`), image prompts through a vision-language model's processor and its chat
template (`encode_image_prompt`), image files read (`read_image`); and the tokens named
back (`token_strings`). What the adapters need of a tokenizer or processor.

An image prompt is an image (a file path, a PIL image or an (H, W, 3) array) with a
question, or a chat whose messages hold {"type": "image", "image": ...} and
{"type": "text", "text": ...} entries.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from explain.errors import InputError

__all__ = [
    "checked_texts",
    "encode",
    "encode_image_prompt",
    "image_prompt_texts",
    "is_image_prompt",
    "is_raw_text",
    "photos",
    "read_image",
    "skipped_tokens",
    "token_strings",
    "unicode_text",
]


def is_raw_text(inputs: object) -> bool:
    """A string, or a non-empty list or tuple that holds a string: what a user means as
    text (a mixed list is text with a mistake in it, refused by `checked_texts`)."""
    return isinstance(inputs, str) or (
        isinstance(inputs, list | tuple)
        and len(inputs) > 0
        and any(isinstance(text, str) for text in inputs)
    )


def unicode_text(text: str, what: str = "the text") -> str:
    """`text` when it is valid Unicode; InputError when it holds a lone surrogate (what
    Python makes of invalid UTF-8 on a command line), which no tokenizer or file takes.
    The one such check of every text a caller gives (explain, cite, the viewer)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InputError(
            f"{what} is not valid Unicode: character {error.start} is a lone surrogate "
            f"({text[error.start]!r}, invalid UTF-8); fix its encoding"
        ) from None
    return text


def checked_texts(texts: object) -> list[str]:
    """`texts` (one text or a sequence of texts) as a list of strings with some content,
    or an InputError that says which entry is not."""
    batch = [texts] if isinstance(texts, str) else list(texts)  # type: ignore[call-overload]
    if not batch:
        raise InputError("no texts given: pass a text or a non-empty list of texts")
    for index, text in enumerate(batch):
        if not isinstance(text, str):
            raise InputError(
                f"text {index} is a {type(text).__name__} ({text!r}), not a string; pass "
                "texts as strings only"
            )
        if not text.strip():
            raise InputError(f"text {index} is empty: there is nothing to explain")
        unicode_text(text, f"text {index}")
    return batch


def encode(tokenizer: Any, texts: str | Sequence[str]) -> Any:
    """Tokenize `texts` into a padded batch for `Explainer.explain`.

    Empty or blank texts are refused (there is nothing to explain), and so are texts of
    which the tokenizer keeps no token (invisible or control characters only). Nothing is
    truncated silently: a text longer than the model takes is refused when explained. The
    batch is padded on the right whatever the tokenizer's `padding_side`: every supported
    model reads right padding, and a classifier that reads the first token needs it.
    """
    batch = checked_texts(texts)
    encoded = tokenizer(
        batch,
        padding=True,
        truncation=False,
        padding_side="right",
        return_special_tokens_mask=True,
        return_tensors="pt",
        verbose=False,  # an over-long text gets explain's error, not a logged warning too
    )
    special = encoded.pop("special_tokens_mask")
    mask = encoded.get("attention_mask")
    real = ~special.bool() if mask is None else mask.bool() & ~special.bool()
    for index in (~real.any(dim=1)).nonzero().flatten().tolist():
        raise InputError(
            f"text {index} ({batch[index]!r}) has no token: the tokenizer drops all of its "
            "characters (invisible or control characters), so there is nothing to explain"
        )
    return encoded


def token_strings(tokenizer: Any, input_ids: Tensor) -> list[list[str]]:
    """Per text, the token string at every position (padding included), aligned with the
    relevance."""
    return [tokenizer.convert_ids_to_tokens(row.tolist()) for row in input_ids.cpu()]


# -- images and image prompts ------------------------------------------------------------


def skipped_tokens(tokenizer: Any) -> set[str]:
    """The tokens the views of a text leave out (explain.viz.text's `skip`): the
    tokenizer's special tokens ([CLS], [SEP], <s>, padding, ...), less its unknown token
    where that has no other role: [UNK] stands for a piece of the input the vocabulary
    lacks (an emoji, for BERT's), which the model read and which has relevance, so it is
    shown as the model saw it. (CLIP's unknown token is its end token too: left out.)"""
    special = set(tokenizer.all_special_tokens)
    unknown = getattr(tokenizer, "unk_token", None)
    roles = ("bos_token", "eos_token", "pad_token", "cls_token", "sep_token", "mask_token")
    if unknown is not None and unknown not in {getattr(tokenizer, r, None) for r in roles}:
        special.discard(unknown)
    return special


def read_image(path: str | os.PathLike[str]) -> Any:
    """The image file `path` as an RGB PIL image, fully read (InputError if unreadable)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except FileNotFoundError:
        raise InputError(f"image file not found: {path}") from None
    except Image.DecompressionBombError as error:
        raise InputError(
            f"{path} is too large to read safely ({error}); if you trust the file, raise "
            "PIL.Image.MAX_IMAGE_PIXELS before explaining it"
        ) from None
    except (UnidentifiedImageError, OSError) as error:
        raise InputError(f"cannot read {path} as an image: {error}") from None


def is_image_prompt(inputs: object) -> bool:
    """Whether `inputs` is an image prompt as people give one: a {"image", "text"}
    mapping, or one chat (or several) whose messages hold {"type": "image"} entries."""
    if isinstance(inputs, Mapping):
        return "image" in inputs or "images" in inputs
    return _chats(inputs) is not None


def _chats(inputs: object) -> list[list[Mapping[str, Any]]] | None:
    """`inputs` as a list of conversations, or None when it is not one or several chats."""
    if not isinstance(inputs, Sequence) or isinstance(inputs, str) or not inputs:
        return None
    first = inputs[0]
    conversations = [inputs] if isinstance(first, Mapping) else list(inputs)
    for conversation in conversations:
        if isinstance(conversation, str | Mapping) or not isinstance(conversation, Sequence):
            return None
        if not conversation or not all(
            isinstance(m, Mapping) and {"role", "content"} <= set(m) for m in conversation
        ):
            return None
    return conversations  # type: ignore[return-value]


def photos(inputs: object) -> list[Any]:
    """The images of an image prompt, loaded as PIL images, in the order the processor
    reads them (per conversation, in message order)."""
    if isinstance(inputs, Mapping):
        given = inputs.get("images", inputs.get("image"))
        return [_load_image(i) for i in (given if isinstance(given, list | tuple) else [given])]
    found = []
    for conversation in _chats(inputs) or []:
        for message in conversation:
            if not isinstance(message["content"], str):
                found += [
                    _load_image(entry["image"])
                    for entry in message["content"]
                    if entry.get("type") == "image" and "image" in entry
                ]
    return found


def _load_image(image: object) -> Any:
    """A path, a PIL image or an (H, W, 3) array (integers in 0..255, or floats in
    [0, 1]) as a PIL RGB image."""
    import numpy as np
    from PIL import Image

    if isinstance(image, str | Path):
        return read_image(image)
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, np.ndarray | Tensor):
        if isinstance(image, Tensor):  # numpy has no bfloat16: floats as float32
            image = image.detach().cpu()
            image = image.float() if image.is_floating_point() else image
        array = np.asarray(image)
        if array.ndim != 3 or array.shape[-1] != 3:
            raise InputError(f"an image array must be (H, W, 3), got {array.shape}")
        return Image.fromarray(_as_bytes(array))
    raise InputError(
        f"an image is a file path, a PIL image or an (H, W, 3) array; got {type(image).__name__}"
    )


def _as_bytes(array: Any) -> Any:
    """An image array as uint8: integers taken as they are, floats in [0, 1] scaled by
    255. Other values are refused, never clipped: a photo in 0..255 given as floats
    would otherwise be read as almost white."""
    import numpy as np

    if array.dtype == np.uint8:
        return array
    if np.issubdtype(array.dtype, np.integer):
        if array.size and (array.min() < 0 or array.max() > 255):
            raise InputError(
                f"an image array of integers must hold 0..255, got {array.min()}..{array.max()}"
            )
        return array.astype(np.uint8)
    if not np.issubdtype(array.dtype, np.floating):
        raise InputError(
            f"an image array must hold integers in 0..255 or floats in [0, 1], got {array.dtype}"
        )
    if not np.isfinite(array).all():
        raise InputError("an image array holds NaN or infinite values")
    if array.size and (array.min() < 0.0 or array.max() > 1.0):
        low, high = float(array.min()), float(array.max())
        hint = (
            "a photo in 0..255 given as floats: divide it by 255, or give it as uint8"
            if high > 1.0 and low >= 0.0
            else "clip it to [0, 1] if that is what it means"
        )
        raise InputError(
            f"an image array of floats must hold values in [0, 1], got {low:g}..{high:g}; {hint}"
        )
    return (array * 255).round().astype(np.uint8)


def encode_image_prompt(inputs: object, processor: Any) -> dict[str, Tensor]:
    """An image prompt through `processor` (an `AutoProcessor`, with its chat template):
    input_ids, attention_mask (left-padded) and pixel_values."""
    texts, given = image_prompt_texts(inputs, processor)
    encoded = processor(
        images=given, text=texts, padding=True, padding_side="left", return_tensors="pt"
    )
    return dict(encoded)


def image_prompt_texts(inputs: object, processor: Any) -> tuple[list[str], list[list[Any]]]:
    """An image prompt's texts as `encode_image_prompt` hands them to `processor` (each
    rendered by its chat template, the images' placeholders unexpanded) and each text's
    images."""
    if processor is None or not hasattr(processor, "image_processor"):
        raise InputError(
            "an image prompt needs the model's processor: Explainer(model, "
            "tokenizer=processor) (AutoProcessor.from_pretrained(...)), or pass the "
            "processor's output (input_ids, attention_mask, pixel_values)"
        )
    given: list[list[Any]]  # each text's images, apart: a processor that nests a flat list
    # as one text's images (SmolVLM's) would give them all to the first
    if isinstance(inputs, Mapping):
        images = photos(inputs)
        texts = inputs.get("text", inputs.get("question"))
        if not images:
            raise InputError("the prompt holds no image: add a {'type': 'image'} entry")
        if texts is None:
            raise InputError("an image prompt mapping needs 'image' and 'text'")
        texts = [texts] if isinstance(texts, str) else list(texts)
        if len(images) % len(texts):
            raise InputError(
                f"{len(images)} images for {len(texts)} questions: give each question as "
                "many images (in order: the first question's, then the next one's)"
            )
        each = len(images) // len(texts)  # several images per question: one map each
        entries = [{"type": "image"}] * each
        conversations: list[list[Mapping[str, Any]]] = [
            [{"role": "user", "content": [*entries, {"type": "text", "text": t}]}] for t in texts
        ]
        given = [images[i * each : (i + 1) * each] for i in range(len(texts))]
    else:
        conversations = _chats(inputs) or []
        given = [photos(conversation) for conversation in conversations]
        if not any(given):
            raise InputError("the prompt holds no image: add a {'type': 'image'} entry")
    if getattr(processor, "chat_template", None) is not None:
        texts = [
            processor.apply_chat_template(_without_images(c), add_generation_prompt=True)
            for c in conversations
        ]
    elif not isinstance(inputs, Mapping):  # a model prompted without a template: PaliGemma
        raise InputError(
            "this processor has no chat template: give the image and the question as "
            "{'image': ..., 'text': ...}, or the processor's output"
        )
    elif isinstance(getattr(processor, "image_token", None), str):
        # the images' placeholders first, as such processors expect them (they warn else)
        texts = [processor.image_token * each + text for text in texts]
    if any(not text.strip() for text in texts):
        raise InputError("a prompt is empty: there is nothing to answer")
    return texts, given


def _without_images(conversation: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A conversation for the chat template: image entries keep their place, not their
    pixels (the template writes the placeholder; the processor reads the images)."""
    return [
        {
            **message,
            "content": message["content"]
            if isinstance(message["content"], str)
            else [
                {"type": "image"} if entry.get("type") == "image" else dict(entry)
                for entry in message["content"]
            ],
        }
        for message in conversation
    ]
