"""The model side of `explain serve`: one loaded model, its Explainer, and the answers the
page asks for, as JSON-able dicts.

Everything runs through the public API (`Explainer.explain`, `explain_generation`,
`Explanation.save`), so concurrent requests on the one model are serialised by the
engine's own lock and leave the model exactly as found. Raw relevance maps are cached
per (model, method, input hash, class): the page's scaling, which depends on what is
shown together, is computed from them at answer time (explain.serve.scales), with the
caption that states the rule.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from explain.api import Explainer
from explain.defaults import default_method
from explain.engine import Request, supported_methods
from explain.errors import ExplainError, InputError, TargetError
from explain.explanation import Explanation
from explain.inputs import skipped_tokens, unicode_text
from explain.loading.loaded_model import LoadedModel
from explain.rules import METHODS
from explain.serve.cache import ResultCache, model_identity
from explain.serve.cancel import stop_if_cancelled
from explain.serve.scales import ViewScale, check_rule, scale_view
from explain.viz.image import BACKGROUNDS, CLASS_AGNOSTIC, greyed, method_label
from explain.viz.ranking import sources_text
from explain.viz.scaling import DIVERGING, RULES, SEQUENTIAL

__all__ = ["MAX_TOKENS", "Workbench"]

MAX_CLASSES = 10
"""The most classes one view explains at once."""
MAX_CAPTIONS = 10
"""The most captions one CLIP view compares."""
MAX_NEW_TOKENS = 64
"""The most tokens the generation view generates."""
MAX_TOKENS = 4096
"""The most tokens of a text the viewer explains or exports (a prompt, a sentence, a
caption), where the model takes no fewer (`Workbench.max_tokens`): twice the longest the
zoo's models are trained on (2,048 tokens), for the cost of one view on a CPU."""
_INDEX_END = 2**63
"""One past the largest index a class can have (a target is an int64 tensor)."""
_GREY = " The image is shown in grey: every colour is relevance."
"""What an image view's caption adds: the maps are drawn over the image in grey."""
_OFF_THE_SCALE = (
    " The token a generated token is read out at (the one just before it, hatched grey) is "
    "off the scale: its own identity term would swamp the rest."
)
"""What the generation view's caption adds, as the figure and the terminal say it."""

Kind = Literal["image", "text", "generation", "clip"]


class Workbench:
    """One model ready to answer the page.

    Attributes:
        loaded: the model and how to feed it.
        spec: the spec it was loaded from (with its files' sizes and times, when it is a
            local path, part of every cache key: explain.serve.cache.model_identity).
        kind: "image" (classifier), "text" (classifier), "generation" (a language model)
            or "clip" (an image-text dual encoder).
        max_tokens: the most tokens of a text its views take: MAX_TOKENS, or fewer where
            the model's position embeddings end sooner.
        methods: the methods this model can be explained with in its view, as the
            engine decides before any forward (explain.engine.supported_methods): the
            only ones the page offers and the views accept.
        default: the method a view runs when its request names none, the default of
            the model's kind (explain.defaults), the one the page checks first
            and the gallery pass explains each image's prediction with.
    """

    def __init__(self, loaded: LoadedModel, cache: ResultCache, spec: str) -> None:
        self.loaded = loaded
        self.cache = cache
        self.spec = spec
        self._identity = model_identity(spec)
        self.explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
        self.kind: Kind = _kind(loaded)
        # A language model's view explains generations, which some methods cannot fold.
        request = Request(prompt_length=1) if self.kind == "generation" else None
        self.methods: list[str] = supported_methods(self.explainer.adapter, request)
        self.default = default_method(self.explainer.adapter, request)
        self.max_tokens = _token_limit(loaded.model)

    def info(self) -> dict[str, Any]:
        """What the page needs to draw its controls."""
        return {
            "model": self.spec,
            "kind": self.kind,
            # A language model's config names classes (LABEL_0, LABEL_1) its head never
            # scores: its view explains generated tokens, not classes.
            "classes": [] if self.kind == "generation" else list(self.loaded.classes or []),
            "multi_label": self.loaded.multi_label,
            "methods": self.methods,
            "default_method": self.default.method,
            "default_reason": f"the default of its kind ({self.default.kind}): {self.default.why}",
            "rules": list(RULES),
            "max_tokens": self.max_tokens,
            "class_agnostic": CLASS_AGNOSTIC,  # what a map headed "(class-agnostic)" means
            "image_size": list(self.loaded.image_size) if self.loaded.image_size else None,
            "colormaps": {"sequential": _lut(SEQUENTIAL), "diverging": _lut(DIVERGING)},
        }

    # --- images ----------------------------------------------------------------------

    def model_input(self, photos: Sequence[Any]) -> Tensor:
        """RGB PIL images -> the batch the model takes, on its device and in its dtype."""
        preprocessing = self.loaded.preprocessing
        if preprocessing is None:
            raise InputError(f"{self.spec} takes no images")
        images = preprocessing(list(photos))
        return images.to(device=self.loaded.device, dtype=self.loaded.dtype)

    def view_png(self, photo: Any, background: str = "colour") -> bytes:
        """The image as the model sees it (resized, cropped, normalisation undone), as PNG:
        the maps are drawn over exactly these pixels. `background="grey"`: in grey, as
        the figures draw it under their maps (explain.viz.image.greyed), so that every
        colour on a map is relevance and a red object is never taken for heat."""
        from PIL import Image

        if background not in BACKGROUNDS:
            raise InputError(f"background must be one of {', '.join(BACKGROUNDS)}")
        preprocessing = self.loaded.preprocessing
        if preprocessing is None:
            raise InputError(f"{self.spec} takes no images")
        pixels = preprocessing([photo])[0].float()
        mean = torch.tensor(preprocessing.mean)[:, None, None]
        std = torch.tensor(preprocessing.std)[:, None, None]
        rgb = (pixels * std + mean).clamp(0, 1)
        shown = greyed(rgb) if background == "grey" else rgb.permute(1, 2, 0).numpy()
        buffer = io.BytesIO()
        Image.fromarray((shown * 255).round().astype(np.uint8)).save(buffer, format="PNG")
        return buffer.getvalue()

    def predict_images(self, photos: Sequence[Any], hashes: Sequence[str]) -> list[dict]:
        """Prediction and confidence of each image (`hashes`: their content hashes)."""
        self._require("image")
        logits = self._first_pass(self.model_input(photos), hashes)
        return [self._prediction(row) for row in logits]

    def cached_prediction(self, file_hash: str) -> dict | None:
        """The prediction of a file whose logits are cached, else None."""
        logits = self.cache.get(self._logits_key(file_hash))
        return None if logits is None else self._prediction(torch.tensor(logits))

    def explain_image(
        self,
        photo: Any,
        file_hash: str,
        methods: Sequence[str],
        classes: Sequence[int] | None,
        top: int,
        rule: str,
    ) -> dict[str, Any]:
        """Methods x classes maps of one image (`classes`, or the `top` highest), raw and
        scaled together by `rule`, with the caption that states the rule."""
        self._require("image")
        methods = self._checked_methods(methods)
        check_rule(rule)
        logits = self._logits(file_hash, lambda: self.model_input([photo]))
        columns = self._columns(logits, classes, top)
        grids = {
            method: self._maps(method, file_hash, columns, lambda: self.model_input([photo]))
            for method in methods
        }
        answer = self._answer(logits, columns, grids, rule)
        if answer["caption"]:
            answer["caption"] += _GREY
        return answer

    def export(
        self,
        make_inputs: Callable[[], Any],
        method: str,
        classes: Sequence[int],
        suffix: str,
        settings: dict[str, Any],
    ) -> Path:
        """The explanation of `classes` (none: the predicted class) with `method`, written
        by `Explanation.save` to a file under the cache's exports folder (`suffix`: ".npz"
        or ".json"). At most MAX_CLASSES classes, as in the views: each one is a backward
        pass and a map in the file."""
        (method,) = self._checked_methods([method])
        classes = self._checked_classes(classes)
        target = torch.tensor([classes]) if classes else None
        stop_if_cancelled()
        result = self.explainer.explain(make_inputs(), target=target, method=method)
        result = _with_settings(result, {"model": self.spec, **settings})
        name = ResultCache.key(self._identity, method, classes, settings) + suffix
        path = self.cache.exports / name
        result.save(path)
        return path

    # --- text ------------------------------------------------------------------------

    def explain_text(
        self,
        text: str,
        methods: Sequence[str],
        classes: Sequence[int] | None,
        top: int,
        rule: str,
    ) -> dict[str, Any]:
        """Token relevance of `text` for methods x classes, scaled together by `rule`."""
        self._require("text")
        text = self.checked_text(text)
        methods = self._checked_methods(methods)
        check_rule(rule)
        text_hash = hashlib.sha256(text.encode()).hexdigest()
        logits = self._logits(text_hash, lambda: [text])
        columns = self._columns(logits, classes, top)
        grids = {
            method: self._maps(method, text_hash, columns, lambda: [text]) for method in methods
        }
        answer = self._answer(logits, columns, grids, rule)
        answer["tokens"] = self.loaded.tokenizer.convert_ids_to_tokens(
            self.loaded.tokenizer([text])["input_ids"][0]
        )
        return answer

    def explain_generation(self, prompt: str, max_new_tokens: int, method: str) -> dict[str, Any]:
        """Generate a continuation of `prompt` and explain each generated token, as the
        terminal and the figure show it (explain.generation.Answer): row g of `rows` is
        the relevance of every earlier token for generated token g, up to the token it
        is read out at (`readouts[g]`), which is off the colour scale (`display[g]` stops
        before it: its own identity term would swamp the rest) and out of `sources[g]`,
        the tokens it was generated mostly from as every view writes them
        (explain.viz.ranking: by |relevance|, with positions and signed values)."""
        from explain.generation import explain_generation

        self._require("generation")
        prompt = self.checked_text(prompt)
        (method,) = self._checked_methods([method])
        if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
            raise InputError(f"max_new_tokens must be 1..{MAX_NEW_TOKENS}, got {max_new_tokens}")
        stop_if_cancelled()
        found = explain_generation(self.explainer, prompt, max_new_tokens, method=method)
        answer = found.answer(0)
        matrix = answer.relevance.float().cpu().numpy()
        generated = range(len(answer.generated))
        readouts = [answer.readout(g) for g in generated]
        rows = [matrix[g, : readouts[g] + 1] for g in generated]
        scaled = [scale_view([row[:-1]]) for row in rows]
        return {
            "method": method,
            "tokens": answer.tokens,
            "prompt_tokens": answer.prompt_length,
            "rows": [row.tolist() for row in rows],
            "readouts": readouts,
            "sources": [
                sources_text(answer.tokens, matrix[g], answer.rests_on(g)) for g in generated
            ],
            "display": [s.maps[0].tolist() for s in scaled],
            "signed": [s.signed[0] for s in scaled],
            "keys": [s.keys for s in scaled],  # each row's own: the page shows the one clicked
            "caption": scaled[0].caption + _OFF_THE_SCALE if scaled else "",
        }

    # --- CLIP ------------------------------------------------------------------------

    def explain_clip(self, photo: Any, captions: Sequence[str], method: str) -> dict[str, Any]:
        """The image's map and each caption's token relevance for every caption, with
        the zero-shot probability of each caption."""
        (method,) = self._checked_methods([method])
        inputs = self.clip_inputs(photo, captions)
        captions = [c.strip() for c in captions]
        stop_if_cancelled()
        result = self.explainer.explain(
            inputs, target=torch.arange(len(captions))[None], method=method
        )
        tokenizer = self.loaded.tokenizer
        special = set(tokenizer.convert_tokens_to_ids(sorted(skipped_tokens(tokenizer))))
        probabilities = result.logits.float().softmax(dim=-1)[0]
        image_maps = result.relevance[0].float().cpu().numpy()
        scaled = scale_view(list(image_maps))
        answers = []
        for k, caption in enumerate(captions):
            ids = inputs["input_ids"][k].tolist()
            mask = inputs["attention_mask"][k].tolist()
            kept = [
                i for i, (t, m) in enumerate(zip(ids, mask, strict=True)) if m and t not in special
            ]
            values = result.relevances["text"][0, k, kept].float().cpu().numpy()
            words = scale_view([values]) if len(kept) else None
            answers.append(
                {
                    "caption": caption,
                    "probability": float(probabilities[k]),
                    "map": scaled.map_json(image_maps[k], k),
                    "tokens": tokenizer.convert_ids_to_tokens([ids[i] for i in kept]),
                    "values": values.tolist(),
                    "display": words.maps[0].tolist() if words else [],
                    "signed": words.signed[0] if words else False,
                }
            )
        return {
            "method": method,
            "captions": answers,
            "caption": scaled.caption + _GREY,
            "keys": scaled.keys,
        }

    def clip_inputs(self, photo: Any, captions: Sequence[str]) -> dict[str, Tensor]:
        """A CLIP model's inputs for one image and `captions` (checked)."""
        self._require("clip")
        captions = [self.checked_text(c) for c in captions]
        if not 1 <= len(captions) <= MAX_CAPTIONS:
            raise InputError(f"give 1..{MAX_CAPTIONS} captions, one per line")
        texts = self.loaded.tokenizer(captions, padding=True, return_tensors="pt")
        return {**texts, "pixel_values": self.model_input([photo])}

    # --- shared ----------------------------------------------------------------------

    def checked_text(self, text: str) -> str:
        """A text the viewer explains or exports: not empty, valid Unicode, at most
        `max_tokens` tokens as the model's tokenizer counts them (special tokens
        included); stripped. Refused before any model work."""
        if not isinstance(text, str) or not text.strip():
            raise InputError("the text is empty")
        text = unicode_text(text.strip())
        tokenizer = self.loaded.tokenizer
        if tokenizer is None:
            raise InputError(f"{self.spec} takes no text")
        count = len(tokenizer(text)["input_ids"])
        if count > self.max_tokens:
            why = (
                "the viewer's limit"
                if self.max_tokens == MAX_TOKENS
                else "the model's position embeddings end there"
            )
            raise InputError(
                f"the text has {count} tokens; this view takes at most {self.max_tokens} "
                f"({why}): shorten it"
            )
        return text

    def _checked_methods(self, methods: Sequence[str]) -> list[str]:
        """`methods` without repeats, once each is one this model takes (`self.methods`)."""
        if not methods:
            raise InputError("choose at least one method")
        for method in methods:
            if method not in METHODS:
                raise InputError(f"unknown method {method!r}; known: {', '.join(sorted(METHODS))}")
            if method not in self.methods:
                raise InputError(
                    f"method {method!r} is not available for {self.spec} ({self.kind} "
                    f"model); it takes: {', '.join(self.methods)}"
                )
        return list(dict.fromkeys(methods))

    def _require(self, *kinds: Kind) -> None:
        if self.kind not in kinds:
            raise InputError(f"{self.spec} ({self.kind} model) has no {kinds[0]} view")

    def _first_pass(self, inputs: Any, hashes: Sequence[str]) -> Tensor:
        """(B, C) logits of a batch, from one explanation of the predicted classes with
        the default method; the logits and those maps are cached under the inputs' `hashes`,
        so that opening a gallery image (or a sentence again) costs nothing."""
        stop_if_cancelled()
        result = self.explainer.explain(inputs, method=self.default.method)
        logits = result.logits.float().cpu()
        for offset, input_hash in enumerate(hashes):
            self.cache.put(self._logits_key(input_hash), logits[offset].tolist())
            self.cache.put(
                self._map_key(self.default.method, input_hash, int(result.target[offset])),
                result.relevance[offset].float().cpu().tolist(),
            )
        return logits

    def _logits(self, input_hash: str, make_inputs: Callable[[], Any]) -> Tensor:
        """(C,) logits of one input: cached, or from its first pass."""
        cached = self.cache.get(self._logits_key(input_hash))
        if cached is not None:
            return torch.tensor(cached)
        return self._first_pass(make_inputs(), [input_hash])[0]

    def _logits_key(self, input_hash: str) -> str:
        return ResultCache.key(self._identity, "logits", input_hash)

    def _map_key(self, method: str, input_hash: str, column: int) -> str:
        return ResultCache.key(self._identity, method, input_hash, column)

    def _prediction(self, logits: Tensor) -> dict[str, Any]:
        """The top class and its confidence, and the classes the model says are present,
        each with its confidence, highest first: the top one, or for independent yes/no
        classes every one above one half (none, when no class reaches it)."""
        confidences = _confidences(logits, self.loaded.multi_label)
        index = int(logits.argmax())
        present = (
            [int(i) for i in confidences.argsort(descending=True) if confidences[i] > 0.5]
            if self.loaded.multi_label
            else [index]
        )
        return {
            "index": index,
            "name": self._name(index),
            "confidence": float(confidences[index]),
            "present": [
                {"name": self._name(i), "confidence": float(confidences[i])} for i in present
            ],
        }

    def _name(self, index: int) -> str:
        classes = self.loaded.classes
        return classes[index] if classes and index < len(classes) else f"class {index}"

    def _columns(self, logits: Tensor, classes: Sequence[int] | None, top: int) -> list[int]:
        """The classes to explain: `classes` as given (checked), else the `top` highest."""
        count = logits.numel()
        if classes:
            return self._checked_classes(classes, count)
        if not 1 <= top <= min(count, MAX_CLASSES):
            raise TargetError(f"top must be 1..{min(count, MAX_CLASSES)}, got {top}")
        return logits.argsort(descending=True)[:top].tolist()

    def _checked_classes(self, classes: Sequence[int], count: int | None = None) -> list[int]:
        """`classes` without repeats, once there are at most MAX_CLASSES of them and each
        is an index of the model's `count` classes (None: any index a class can have, the
        engine checks it against the model's output). Checked before any model work:
        each class is a backward pass and a map."""
        if len(classes) > MAX_CLASSES:
            raise TargetError(f"at most {MAX_CLASSES} classes at once, got {len(classes)}")
        for index in classes:
            if not 0 <= index < (count or _INDEX_END):
                within = f" (0..{count - 1})" if count else ""
                raise TargetError(f"class {index} is out of range{within}")
        return list(dict.fromkeys(classes))

    def _maps(
        self, method: str, input_hash: str, columns: list[int], make_inputs: Callable[[], Any]
    ) -> list[np.ndarray] | str:
        """The raw maps of `columns` with `method`, from the cache or computed (the missing
        ones in one call); a method the model does not support gives its error message."""
        keys = [self._map_key(method, input_hash, c) for c in columns]
        found = [self.cache.get(k) for k in keys]
        missing = [c for c, f in zip(columns, found, strict=True) if f is None]
        if missing:
            stop_if_cancelled()  # before each method's work: the client may have gone
            try:
                result = self.explainer.explain(
                    make_inputs(), target=torch.tensor([missing]), method=method
                )
            except ExplainError as error:
                return str(error)
            computed = dict(zip(missing, result.relevance[0].float().cpu(), strict=True))
            for c, key in zip(columns, keys, strict=True):
                if c in computed:
                    self.cache.put(key, computed[c].tolist())
            found = [
                f if f is not None else computed[c].tolist()
                for c, f in zip(columns, found, strict=True)
            ]
        return [np.asarray(f, dtype=np.float64) for f in found]

    def _answer(
        self,
        logits: Tensor,
        columns: list[int],
        grids: dict[str, list[np.ndarray] | str],
        rule: str,
    ) -> dict[str, Any]:
        """The JSON answer: the classes, each method's maps (raw and scaled by `rule`
        over every map shown, explain.serve.scales) or its error, the colour keys and
        the caption that states the rule."""
        confidences = _confidences(logits, self.loaded.multi_label)
        drawn = [m for maps in grids.values() if not isinstance(maps, str) for m in maps]
        scaled: ViewScale | None = scale_view(drawn, rule) if drawn else None
        methods, position = [], 0
        for method, maps in grids.items():
            # headed as the figures head it: "rollout (class-agnostic)"
            agnostic = not METHODS[method].class_specific
            named = {"method": method, "label": method_label(method, agnostic)}
            if isinstance(maps, str):
                methods.append({**named, "error": maps})
                continue
            assert scaled is not None
            entries = [scaled.map_json(m, position + i) for i, m in enumerate(maps)]
            position += len(maps)
            methods.append({**named, "class_agnostic": agnostic, "maps": entries})
        return {
            "prediction": self._prediction(logits),
            "classes": [
                {"index": c, "name": self._name(c), "confidence": float(confidences[c])}
                for c in columns
            ],
            "methods": methods,
            "rule": rule,
            "caption": scaled.caption if scaled else "",
            "keys": scaled.keys if scaled else [],
        }


def _kind(loaded: LoadedModel) -> Kind:
    if loaded.modality == "vision_language":
        raise InputError(
            f"{loaded.name} answers questions about images; explain serve has no view for "
            'that yet: use `explain generate --image PHOTO "QUESTION"`'
        )
    if loaded.image_processor is not None:
        raise InputError(
            f"{loaded.name} is an object detector; explain serve has no view for detections "
            "yet: use `explain detect`"
        )
    if loaded.modality == "image_text":
        return "clip"
    if loaded.modality == "image":
        return "image"
    can_generate = getattr(loaded.model, "can_generate", None)
    return "generation" if callable(can_generate) and can_generate() else "text"


def _confidences(logits: Tensor, multi_label: bool) -> Tensor:
    """Each class's probability: sigmoid for independent yes/no classes, else softmax."""
    logits = logits.double()
    return logits.sigmoid() if multi_label else logits.softmax(dim=-1)


def _token_limit(model: Any) -> int:
    """MAX_TOKENS, or the model's own position limit (its text model's, for a model of
    two towers) where that is lower: past it the model cannot read a text at all."""
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    positions = getattr(text, "max_position_embeddings", None)
    return (
        min(MAX_TOKENS, positions) if isinstance(positions, int) and positions > 0 else MAX_TOKENS
    )


def _lut(name: str) -> list[list[int]]:
    """The 256 RGB colours of matplotlib's colormap `name` (the page draws with them, so
    its maps use the colours of explain.viz's figures)."""
    import matplotlib

    colours = matplotlib.colormaps[name](np.linspace(0.0, 1.0, 256))[:, :3]
    return np.round(colours * 255).astype(int).tolist()


def _with_settings(result: Explanation, settings: dict[str, Any]) -> Explanation:
    return dataclasses.replace(result, settings={**result.settings, **settings})
