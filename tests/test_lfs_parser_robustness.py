"""The parsers never raise, whatever `lfs` (or a broken pipe) hands them.

Arbitrary text, and the real samples of tests/fixtures/lfs with lines dropped, duplicated,
truncated or swapped: the parsers must return, and every line they report (as a row or as
unreadable) must be a line of the input, by its number.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fsprobe.lustre.df_parser import parse_df
from fsprobe.lustre.quota_parser import QuotaOutput, parse_quota
from tests.fakes.fake_lfs import load_fixtures

QUOTA_SAMPLES = [
    case[form]["stdout"] if form == "human" else case["stdout"]
    for _, case in load_fixtures("quota")
    for form in (("plain", "human") if "human" in case else ("plain",))
]
DF_SAMPLES = [case["stdout"] for _, case in load_fixtures("df")]
STATUSES = st.integers(min_value=-64, max_value=300)


@st.composite
def damaged(draw, samples: list[list[str]]) -> list[str]:
    """A real sample with a few lines dropped, duplicated, truncated or swapped."""
    lines = list(draw(st.sampled_from(samples)))
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        if not lines:
            break
        index = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        action = draw(st.sampled_from(["drop", "duplicate", "truncate", "swap", "garble"]))
        if action == "drop":
            del lines[index]
        elif action == "duplicate":
            lines.insert(index, lines[index])
        elif action == "truncate":
            lines[index] = lines[index][: draw(st.integers(0, max(0, len(lines[index]) - 1)))]
        elif action == "swap":
            other = draw(st.integers(min_value=0, max_value=len(lines) - 1))
            lines[index], lines[other] = lines[other], lines[index]
        else:
            position = draw(st.integers(0, len(lines[index])))
            noise = draw(st.text(alphabet="[]*- 0123456789kMGTP.", max_size=4))
            lines[index] = lines[index][:position] + noise + lines[index][position:]
    return lines


def _rows_and_targets(output: QuotaOutput):
    for section in output.sections:
        for row in section.rows:
            yield row.line
            yield from (target.line for target in row.targets)
        yield from (row.line for row in section.default_rows)


def assert_lines_refer_to_input(stdout: str, output) -> None:
    lines = stdout.splitlines()
    for item in output.unparsed:
        if item.stream == "stdout":
            assert lines[item.line - 1].rstrip() == item.text.rstrip()
    if isinstance(output, QuotaOutput):
        for number in _rows_and_targets(output):
            assert 1 <= number <= len(lines)


@given(st.text(), st.text(), STATUSES)
def test_quota_parser_never_raises_on_any_text(stdout: str, stderr: str, status: int):
    output = parse_quota(stdout, stderr, status)
    assert_lines_refer_to_input(stdout, output)


@given(st.text(), st.text(), STATUSES, st.booleans())
def test_df_parser_never_raises_on_any_text(stdout: str, stderr: str, status: int, si: bool):
    output = parse_df(stdout, stderr, status, si=si)
    assert_lines_refer_to_input(stdout, output)


@settings(max_examples=300)
@given(damaged(QUOTA_SAMPLES), STATUSES)
def test_quota_parser_survives_damaged_samples(lines: list[str], status: int):
    stdout = "\n".join(lines) + "\n"
    output = parse_quota(stdout, "", status)
    assert_lines_refer_to_input(stdout, output)


@settings(max_examples=300)
@given(damaged(DF_SAMPLES), STATUSES)
def test_df_parser_survives_damaged_samples(lines: list[str], status: int):
    stdout = "\n".join(lines) + "\n"
    output = parse_df(stdout, "", status)
    assert_lines_refer_to_input(stdout, output)


@given(st.lists(st.sampled_from(["[", "]", "*", "-", " ", "4", "G", "k", "none", "1w"])))
def test_quota_row_made_of_cell_fragments(fragments: list[str]):
    line = "    /mnt/lustre " + " ".join(fragments)
    parse_quota(f"Disk quotas for usr 1 (uid 1):\n{line}\n", "", 0)
