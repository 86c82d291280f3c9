"""Datasets with known ground truth, shipped or generated offline.

- `shapes`: synthetic scenes of shapes with pixel masks (image classification).
- `digits`: scikit-learn's handwritten digits, upsampled (image classification).
- `sentiment`: template sentences with known sentiment words (text classification).
- `captions`: captions naming the objects of `shapes` scenes, and their word-level
  tokenizer (image-text matching).
- `shapes_questions`: templated questions about free-colour `shapes` scenes, their
  answers and the mask of the object each answer is about (vision-language models).

Each has disjoint training and held-out splits; the zoo's models train on the former and
their cards quote accuracy on the latter.
"""
