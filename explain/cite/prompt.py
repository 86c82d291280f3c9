"""A context and a question as the model reads them: the prompt's text, where the context
lies in it, its spans, and which span each prompt token belongs to.

The context is a text, a list of documents (joined by a blank line; each separator
belongs to the document after it) or a chat (a list of {"role", "content"} messages,
rendered by the tokenizer's chat template; the context is then the rendering of the
conversation, role markers included, and its turns start where each message's rendering
starts). The question comes after the context: in `template` for a text or documents
(optionally put through the chat template as one user message, `chat=True`), as one
more user turn for a chat. So the token an answer's first token is read out at is never
in the context, and no span gets that token's own identity term.

A token belongs to the span that holds its first non-whitespace character (the span of
its start when it has none): a subword token such as " The" starts with the whitespace
that the span before would otherwise end on. Tokens outside the context (the template,
the question, special tokens the tokenizer adds) belong to no span (-1). Offsets come
from the tokenizer's offset mapping; a tokenizer without one (a slow, Python tokenizer)
tokenizes the prompt piece by piece instead: the text before the context, each span, the
text after it, with the tokenizer's special tokens around the whole. Its tokens then
never straddle spans, but the ids may differ from tokenizing the prompt at once where
a token would have crossed a seam.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from explain.cite.spans import Span, split
from explain.errors import InputError, OptionError
from explain.inputs import unicode_text

__all__ = [
    "DOCUMENT_SEPARATOR",
    "TEMPLATE",
    "Context",
    "Prompt",
    "assign_tokens",
    "build_prompt",
    "fill_template",
    "read_context",
    "span_sums",
    "tokenize_prompt",
]

TEMPLATE = "{context}\n\n{question}"
"""The default prompt: the context, a blank line, the question."""
DOCUMENT_SEPARATOR = "\n\n"

Message = Mapping[str, str]


@dataclass(frozen=True)
class Context:
    """The context's text and its spans; `messages` holds a chat context's conversation."""

    text: str
    spans: tuple[Span, ...]
    kind: str
    messages: tuple[Message, ...] | None = None


@dataclass(frozen=True)
class Prompt:
    """The prompt's text, the context inside it at `offset`, and its tokenization:
    `input_ids` (P,) and `token_spans` (P,), each token's span index (-1: none)."""

    text: str
    context: Context
    offset: int
    input_ids: Tensor
    token_spans: Tensor


def _is_chat(context: object) -> bool:
    return (
        isinstance(context, Sequence)
        and not isinstance(context, str)
        and len(context) > 0
        and all(isinstance(m, Mapping) for m in context)
    )


def _render(tokenizer: Any, messages: Sequence[Message], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=generation_prompt, tokenize=False
    )


def _require_template(tokenizer: Any) -> None:
    if getattr(tokenizer, "chat_template", None) is None:
        raise InputError(
            "this tokenizer has no chat template: pass the context as a text or a list of "
            "documents, or use the instruct model's own tokenizer"
        )


def read_context(context: object, kind: str = "sentences", tokenizer: Any = None) -> Context:
    """`context` (a text, a list of documents, or a chat) as text and spans of `kind`.

    "documents" needs a list of documents and "turns" a chat; the finer kinds split
    inside each document or turn (a piece's start is always a span's start). A chat is
    rendered with `tokenizer`'s chat template."""
    if isinstance(context, str):
        if kind in ("documents", "turns"):
            raise OptionError(
                f"spans={kind!r} needs the context as a list of "
                f"{'documents' if kind == 'documents' else 'chat messages'}, not one text"
            )
        return Context(context, tuple(split(context, kind)), kind)
    if _is_chat(context):
        if kind == "documents":
            raise OptionError("the context is a chat: its pieces are turns (spans='turns')")
        return _chat_context(context, kind, tokenizer)  # type: ignore[arg-type]
    if (
        isinstance(context, Sequence)
        and context
        and all(isinstance(document, str) for document in context)
    ):
        if kind == "turns":
            raise OptionError("the context is a list of documents, not a chat: no turns")
        documents = list(context)
        for index, document in enumerate(documents):
            if not document.strip():
                raise InputError(f"document {index} is empty; leave it out of the context")
        starts, position = [], 0
        for document in documents:
            starts.append(position)
            position += len(document) + len(DOCUMENT_SEPARATOR)
        text = DOCUMENT_SEPARATOR.join(documents)
        # Each separator belongs to the document after it.
        starts = [0] + [start - len(DOCUMENT_SEPARATOR) for start in starts[1:]]
        return Context(text, tuple(split(text, kind, starts)), kind)
    raise InputError(
        "a context is a text, a list of documents (texts), or a chat (a list of "
        f"{{'role', 'content'}} messages); got {type(context).__name__}"
    )


def _chat_context(messages: Sequence[Message], kind: str, tokenizer: Any) -> Context:
    """A chat as its rendering by the chat template, with a span start at every turn."""
    if tokenizer is None:
        raise InputError("a chat context needs the model's tokenizer (its chat template)")
    _require_template(tokenizer)
    for index, message in enumerate(messages):
        if not {"role", "content"} <= set(message) or not all(
            isinstance(message[key], str) for key in ("role", "content")
        ):
            raise InputError(f"message {index} of the chat needs a 'role' and a 'content' text")
    text = _render(tokenizer, messages, generation_prompt=False)
    starts = [0]
    for count in range(1, len(messages)):
        before = _render(tokenizer, messages[:count], generation_prompt=False)
        if not text.startswith(before):
            raise InputError(
                "this chat template does not render a conversation as the rendering of its "
                "first turns followed by the rest, so the turns have no place in the text; "
                "pass the conversation's text as a list of documents instead"
            )
        starts.append(len(before))
    return Context(text, tuple(split(text, kind, starts)), kind, tuple(messages))


def build_prompt(
    tokenizer: Any,
    context: Context,
    question: str,
    template: str = TEMPLATE,
    chat: bool = False,
) -> Prompt:
    """The prompt for `question` about `context`, tokenized (see the module doc).

    `template` holds "{context}" and then "{question}" once each (other braces are kept
    as they are); it is not used for a chat context, whose question is a user turn.
    `chat` puts the filled template through the tokenizer's chat template as one user
    message."""
    if not isinstance(question, str) or not question.strip():
        raise InputError("the question is empty: ask the model something about the context")
    special = True
    if context.messages is not None:
        _require_template(tokenizer)
        asked = [*context.messages, {"role": "user", "content": question}]
        text = _render(tokenizer, asked, generation_prompt=True)
        if not text.startswith(context.text):
            raise InputError(
                "this chat template renders the conversation differently once the question "
                "is added, so the context has no place in the prompt; pass the "
                "conversation's text as a list of documents instead"
            )
        offset, special = 0, False
    else:
        filled, offset = fill_template(template, context.text, question)
        text = filled
        if chat:
            _require_template(tokenizer)
            text = _render(tokenizer, [{"role": "user", "content": filled}], True)
            at = text.find(filled)
            if at < 0:
                raise InputError(
                    "the chat template changes the message's text (it strips or escapes "
                    "it), so the context cannot be found in the prompt; use chat=False"
                )
            offset += at
            special = False  # the template writes the special tokens itself
    ids, spans = tokenize_prompt(tokenizer, text, context, offset, special)
    return Prompt(text, context, offset, ids, spans)


def fill_template(template: str, context: str, question: str) -> tuple[str, int]:
    """`template` with the `context` text and the `question` in it, and where the
    context starts in the result."""
    before, after = _split_template(template)
    return before + context + after.replace("{question}", question, 1), len(before)


def _split_template(template: str) -> tuple[str, str]:
    """The template's text before "{context}", and after it (with "{question}")."""
    if template.count("{context}") != 1 or template.count("{question}") != 1:
        raise OptionError(
            f"the template must hold {{context}} and {{question}} once each; got {template!r}"
        )
    before, after = template.split("{context}")
    if "{question}" not in after:
        raise OptionError(
            "the template must put {context} before {question}: the answer's first token "
            "is read out at the prompt's last token, which must not be in the context"
        )
    return before, after


def assign_tokens(
    text: str, offsets: Sequence[tuple[int, int]], starts: list[int], end: int
) -> Tensor:
    """Each token's span (see the module doc) from its character `offsets` in `text`;
    `starts` are the spans' starts in `text`, `end` the last span's end there."""
    found = []
    for a, b in offsets:
        if a >= b:  # a special token the tokenizer added: no text
            found.append(-1)
            continue
        stripped = len(text[a:b]) - len(text[a:b].lstrip())
        at = a + stripped if stripped < b - a else a
        inside = starts[0] <= at < end
        found.append(bisect.bisect_right(starts, at) - 1 if inside else -1)
    return torch.tensor(found, dtype=torch.long)


def tokenize_prompt(
    tokenizer: Any, text: str, context: Context, offset: int, special: bool
) -> tuple[Tensor, Tensor]:
    """(input_ids (P,), token_spans (P,)) of the prompt `text`, whose context starts at
    `offset`; `special`: whether the tokenizer adds its special tokens."""
    unicode_text(text, "the prompt (context, question or template)")
    starts = [offset + span.start for span in context.spans]
    end = offset + len(context.text)
    try:
        encoded = tokenizer(
            text, add_special_tokens=special, return_offsets_mapping=True, verbose=False
        )
    except NotImplementedError:  # a Python tokenizer has no offset mapping
        return _tokenize_pieces(tokenizer, text, context, offset, special)
    ids = torch.tensor(encoded["input_ids"], dtype=torch.long)
    # The special tokens the tokenizer adds have empty offsets: they belong to no span.
    offsets = [tuple(pair) for pair in encoded["offset_mapping"]]
    if ids.numel() == 0:
        raise InputError("the tokenizer keeps no token of the prompt")
    return ids, assign_tokens(text, offsets, starts, end)  # type: ignore[arg-type]


def _tokenize_pieces(
    tokenizer: Any, text: str, context: Context, offset: int, special: bool
) -> tuple[Tensor, Tensor]:
    """The prompt tokenized piece by piece (a tokenizer without offsets; module doc)."""
    pieces = [(text[:offset], -1)]
    pieces += [(span.text, index) for index, span in enumerate(context.spans)]
    pieces.append((text[offset + len(context.text) :], -1))
    ids: list[int] = []
    owners: list[int] = []
    for piece, owner in pieces:
        if piece:
            found = tokenizer(piece, add_special_tokens=False, verbose=False)["input_ids"]
            ids += found
            owners += [owner] * len(found)
    if special:
        whole = tokenizer.build_inputs_with_special_tokens(ids)
        lead = next(
            (i for i in range(len(whole) - len(ids) + 1) if whole[i : i + len(ids)] == ids),
            None,
        )
        if lead is None:
            raise InputError("cannot place the tokenizer's special tokens around the prompt")
        owners = [-1] * lead + owners + [-1] * (len(whole) - lead - len(ids))
        ids = whole
    return torch.tensor(ids, dtype=torch.long), torch.tensor(owners, dtype=torch.long)


def span_sums(token_relevance: Tensor, token_spans: Tensor, count: int) -> Tensor:
    """(G, S): the sum of `token_relevance` (G, P) over each span's tokens
    (`token_spans` (P,), -1 for tokens of no span)."""
    inside = token_spans >= 0
    sums = token_relevance.new_zeros(token_relevance.shape[0], count)
    return sums.index_add_(1, token_spans[inside], token_relevance[:, inside])
