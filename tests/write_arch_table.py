"""Write the README's supported-architecture table from the architecture matrix.

``.venv/bin/python -m tests.write_arch_table`` rewrites the part of README.md between the
``arch-table`` markers; ``tests/test_architectures.py`` fails when the README's table is not what
this renders, so the table can only say what the matrix proves. A refused family's reason is the
load error Decoda gives for its config.
"""

from __future__ import annotations

import sys
from pathlib import Path

from decoding.model.registry import ModelLoadError
from decoding.model.support import check_attention_interface, check_config
from tests.arch_families import FAMILIES, REFUSED, Family
from tests.test_arch_gguf import GGUF_ARCH
from tests.test_architectures import COMPILED_BY_DEFAULT, HF_EARLY_EXIT_BREAKS, STRATEGIES

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- arch-table:start (tests/write_arch_table.py writes this) -->", "<!-- arch-table:end -->"
COLUMNS = {
    "greedy": "greedy",
    "sampling": "sampling",
    "beam": "beam",
    "contrastive": "contrastive (4.x algorithm)",
    "dola": "DoLa (4.x algorithm)",
    "prompt_lookup": "prompt lookup",
    "early_exit": "early exit",
}


def refusal(family: Family) -> str:
    """The message ``load_model`` refuses the family's config with."""
    config = family.config()
    try:
        check_config(config)
        check_attention_interface(config)
    except ModelLoadError as error:
        return str(error)
    raise AssertionError(f"{family.model_type} is listed as refused but its config passes")


def cell(family: Family, strategy: str) -> str:
    if strategy in family.skip:
        return f"not run: {family.skip[strategy]}"
    if strategy == "early_exit" and family.model_type in HF_EARLY_EXIT_BREAKS:
        return "exact (= greedy; HF's own raises)"
    return "exact"


def low_bit(family: Family) -> str:
    """int8/int4 swap linears (and Conv1D); fused 3-D expert weights keep their float type."""
    fused = any(p.dim() == 3 for p in family.build().parameters())
    return "exact (MoE experts stay float)" if fused else "exact"


def render() -> str:
    head = ["family", "what the tiny model exercises", *COLUMNS.values(), "mixed batch, prefix cache", "int8 / int4",
            "gguf", "--compile"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for family in FAMILIES:
        cells = [cell(family, name) for name in COLUMNS]
        compiled = (
            "greedy, contrastive exact"
            if family.model_type in COMPILED_BY_DEFAULT
            else "greedy, contrastive exact under DECODA_ARCH_COMPILE_ALL=1 (not run by default)"
        )
        gguf = "exact" if family.model_type in GGUF_ARCH else "n/a: transformers reads no GGUF of it"
        row = [f"`{family.model_type}`", family.features, *cells, "exact", low_bit(family), gguf, compiled]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append("Refused at load (the error names the architecture and why):")
    lines.append("")
    for family in REFUSED:
        lines.append(f"- `{family.model_type}` ({family.features}): {refusal(family)}")
    strategies = ", ".join(STRATEGIES)
    lines.append("")
    lines.append(f"Strategies in the matrix: {strategies}.")
    return "\n".join(lines)


def readme_table(text: str) -> str:
    """What the README holds between the markers."""
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def main() -> int:
    text = README.read_text()
    before, rest = text.split(START, 1)
    after = rest.split(END, 1)[1]
    README.write_text(f"{before}{START}\n{render()}\n{END}{after}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
