"""`triarch model`: a model read from the Hugging Face Hub into Triarch's cache (fetch), so that plans and `triarch
tune` size it where the Hub cannot be reached (triarch.hub)."""

from __future__ import annotations

import argparse

from triarch.cli.common import Commands


def cmd_model_fetch(args: argparse.Namespace) -> int:
    from triarch import hub
    from triarch.tuner.model_files import hub_arch

    read = hub.fetch(args.model, args.revision, hub.env_token())
    arch = hub_arch(read)
    kind = "/".join(arch.architectures) or "no architectures listed"
    count = read.parameter_count
    size = (f"{count / 1e9:.2f}B parameters in {', '.join(sorted(read.parameters))} (the Hub's count of its "
            "safetensors)" if count else "no safetensors parameter count from the Hub")
    print(f"{read.describe()}: {kind} (model_type {arch.model_type}), {size}")
    print(f"  read {', '.join(read.files)} into {read.directory}")
    for note in read.notes:
        print(f"  note: {note}")
    if not read.pinned:
        print(f"  pin it in the stack: revision: {read.commit} (under the model in triarch:models)")
    return 0


def add_parser(commands: Commands) -> None:
    model = commands.add_parser("model", help="read a model's config.json (and the tokenizer and sentence-"
                                              "transformers configs beside it) from the Hugging Face Hub into a "
                                              "cache outside the work tree, for models outside templates/models")
    steps = Commands(model.add_subparsers(dest="step", required=True, metavar="STEP"))
    fetch = steps.add_parser("fetch", help="read a model from the Hub ($HF_ENDPOINT, else huggingface.co; $HF_TOKEN "
                                           "for gated models) at a revision and record the commit it read; exit 2 "
                                           "with one line if the Hub refuses it or the tuner does not know its "
                                           "architecture")
    fetch.add_argument("model", metavar="MODEL", help="a Hugging Face repository id, e.g. "
                                                      "mistralai/Mistral-7B-Instruct-v0.3")
    fetch.add_argument("--revision", help="a commit, branch or tag (default: main)")
    fetch.set_defaults(handler=cmd_model_fetch)
