"""recall-llama: a Llama recalling the value of a key among distractor facts in long
contexts (explain.data.recall), each answer's evidence known."""

from explain.data import recall
from explain.errors import InputError, OptionError
from explain.evaluation import recall_answers
from explain.evaluation.datasets.zoo import RecallHeldout
from explain.evaluation.zoo import ZooEvaluation
from explain.loading.loaded_model import LoadedModel


def _answers(loaded: LoadedModel, length: int | None) -> RecallHeldout:
    """The held-out prompts with the hops the model was trained on, at the trained length
    unless `length` is given; the model's tokenizer must be the data's word-level one (the
    prompts are token ids)."""
    vocabulary = list(recall.VOCABULARY)
    if loaded.tokenizer.convert_tokens_to_ids(vocabulary) != list(range(len(vocabulary))):
        raise InputError(
            f"{loaded.name}'s tokenizer is not the word-level one of explain.data.recall "
            "(recall.build_tokenizer()); its held-out prompts are in that tokenizer's ids"
        )
    length = recall_answers.trained_length(loaded) if length is None else length
    positions = getattr(getattr(loaded.model, "config", None), "max_position_embeddings", None)
    if isinstance(positions, int) and length >= positions:  # before a prompt is built
        raise OptionError(
            f"--length {length}: {loaded.name} reads at most {positions} positions, the "
            f"prompt and its answer included; give a length below {positions}"
        )
    hops = recall_answers.trained_hops(loaded)
    try:
        recall.make_example(recall.SPLITS["heldout"][0], length, hops=hops)
    except ValueError as error:
        raise OptionError(f"--length {length}: {error}") from None
    return RecallHeldout(length, hops=hops)


MODEL = ZooEvaluation(
    name="recall-llama",
    headline="the whole answer, both words, greedy, at the trained length",
    accuracy=recall_answers.recall_accuracy,
    count=1000,
    check=(60, 0.08),
    secondary=recall_answers.other_lengths_accuracy,
    answers=_answers,
    evidence_check=recall_answers.evidence_check,
)
