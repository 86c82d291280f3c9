"""`explain serve`: a local web app to look around a model's explanations in the browser.

A gallery of a folder of images (prediction, confidence, right or wrong), one image's
methods x classes with values on hover and exports; token relevance of typed sentences;
the generation view of a language model; CLIP's image and caption maps. It runs on the
same engine as everything else, through the public API (explain.serve.workbench), on one
Starlette app (explain.serve.app) served by uvicorn (explain.serve.server). Everything
the page needs ships in explain/serve/static: it works without a network.

Why Starlette and uvicorn: they are the core of FastAPI, which ML engineers already serve
models with, and together install in under 2 MB with a fraction of a second to import.
Gradio, the demo tool ML users know best, brings some 200 MB of dependencies (pandas,
FastAPI, ...) and seconds of import, and a map that reads its value under the pointer
would be a custom component of its own anyway. The standard library's http.server has no
thread pool for the model's slow calls, no streaming request limits, and its
documentation warns it off servers.

Needs the `serve` extra: pip install 'explain-transformers[serve]'.
"""

from __future__ import annotations

from explain.serve.app import build_app
from explain.serve.cache import ResultCache, default_cache_folder
from explain.serve.data import DataSource, read_data
from explain.serve.server import BackgroundServer
from explain.serve.workbench import Workbench

__all__ = [
    "BackgroundServer",
    "DataSource",
    "ResultCache",
    "Workbench",
    "build_app",
    "default_cache_folder",
    "read_data",
]
