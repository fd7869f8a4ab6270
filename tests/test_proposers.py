"""Model-free speculative building blocks against HF's own classes: prompt lookup, the draft-length
schedule (and Decoda's back-off), and universal assisted decoding's token alignment."""

from __future__ import annotations

import glob
import math
import random
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.candidate_generator import (
    AssistedCandidateGenerator,
    AssistedCandidateGeneratorDifferentTokenizers,
    PromptLookupCandidateGenerator,
)
from transformers.generation.logits_process import (
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    SuppressTokensLogitsProcessor,
)
from transformers.generation.stopping_criteria import ConfidenceCriteria

from decoding.proposers.draft_schedule import BackoffPolicy, DraftSchedule, should_stop_drafting
from decoding.proposers.prompt_lookup import propose_prompt_lookup
from decoding.proposers.token_alignment import (
    UniversalAligner,
    longest_diagonal,
    longest_diagonal_runs,
    retokenize,
    split_tokens,
)

UAD = AssistedCandidateGeneratorDifferentTokenizers

# --- prompt lookup ---------------------------------------------------------------------------------


def hf_prompt_lookup(ids, num_tokens, ngram, max_length, eos=(), processors=None, vocab_size=None) -> list[int]:
    generator = PromptLookupCandidateGenerator(
        eos_token_id=torch.tensor(list(eos)) if eos else None,
        num_output_tokens=num_tokens,
        max_matching_ngram_size=ngram,
        max_length=max_length,
        logits_processor=processors,
        vocab_size=vocab_size,
    )
    input_ids = torch.tensor([ids])
    candidates, _ = generator.get_candidates(input_ids)
    return candidates[0, len(ids) :].tolist()


def random_sequences(rng: random.Random, count: int) -> list[list[int]]:
    """Random ids over tiny vocabularies (many accidental repeats) and repetitive ones (a motif
    repeated with mutations, like text quoting its prompt)."""
    out = []
    for i in range(count):
        if i % 2:
            out.append([rng.randrange(rng.choice([2, 3, 5, 8])) for _ in range(rng.randrange(1, 40))])
        else:
            motif = [rng.randrange(20) for _ in range(rng.randrange(2, 8))]
            seq = [t if rng.random() > 0.15 else rng.randrange(20) for _ in range(rng.randrange(1, 6)) for t in motif]
            out.append(seq[: rng.randrange(1, len(seq) + 1)])
    return out


def test_prompt_lookup_matches_hf_on_random_and_repetitive_sequences():
    rng = random.Random(0)
    checked = nonempty = 0
    for ids in random_sequences(rng, 400):
        length = len(ids)
        for _ in range(3):
            num_tokens, ngram = rng.randrange(1, 7), rng.randrange(1, 5)
            max_length = rng.choice([length + 1, length + 2, length + 3, length + 50, max(length - 2, 1)])
            eos = rng.choice([(), (rng.randrange(8),), (rng.randrange(8), rng.randrange(20))])
            expected = hf_prompt_lookup(ids, num_tokens, ngram, max_length, eos)
            got = propose_prompt_lookup(ids, num_tokens, ngram, eos_token_ids=eos, max_length=max_length)
            assert got == expected, (ids, num_tokens, ngram, max_length, eos)
            checked += 1
            nonempty += bool(got)
    assert nonempty > checked // 3  # the comparison exercised real drafts, not only "no match"


def test_prompt_lookup_matches_hf_with_forbidden_tokens():
    """HF's logits-processor check: a continuation is cut before a forbidden token and an emptied
    one moves on to the next occurrence."""
    vocab_size = 12
    rng = random.Random(1)
    for ids in random_sequences(rng, 150):
        suppressed = [rng.randrange(vocab_size)]
        processors = LogitsProcessorList(
            [NoRepeatNGramLogitsProcessor(rng.choice([2, 3])), SuppressTokensLogitsProcessor(suppressed)]
        )

        def is_allowed(prefix: list[int], token: int, processors=processors) -> bool:
            scores = processors(torch.tensor([prefix]), torch.ones(1, vocab_size))[0, token]
            return not (scores == -float("inf") or scores == torch.finfo(scores.dtype).min)

        ids = [t % vocab_size for t in ids]
        num_tokens, ngram, max_length = rng.randrange(1, 6), rng.randrange(1, 4), len(ids) + 20
        expected = hf_prompt_lookup(ids, num_tokens, ngram, max_length, (), processors, vocab_size)
        got = propose_prompt_lookup(ids, num_tokens, ngram, max_length=max_length, is_allowed=is_allowed)
        assert got == expected, (ids, num_tokens, ngram, suppressed)


def test_prompt_lookup_search_order_and_eos_rules():
    # longest n-gram first: the bigram (1, 2) matches at 0; the unigram 2 would match earlier at 4
    assert propose_prompt_lookup([9, 2, 7, 1, 2, 5, 6, 1, 2], 2, 2) == [5, 6]
    # first occurrence left to right, not the most recent one
    assert propose_prompt_lookup([3, 4, 3, 8, 3], 1, 1) == [4]
    # the continuation stops at the current end of the text
    assert propose_prompt_lookup([1, 2, 1], 10, 1) == [2, 1]
    # eos cuts the drafts; eos right after the match gives none, without looking further
    assert propose_prompt_lookup([1, 5, 0, 1, 6, 1], 3, 1, eos_token_ids={0}) == [5]
    assert propose_prompt_lookup([1, 0, 2, 1, 7, 1], 3, 1, eos_token_ids={0}) == []
    # exactly one position left: no drafts; no repeat: none
    assert propose_prompt_lookup([1, 2, 1], 3, 1, max_length=4) == []
    assert propose_prompt_lookup([1, 2, 3], 3, 2) == []
    with pytest.raises(ValueError):
        propose_prompt_lookup([1, 2], 0, 2)


# --- draft schedule --------------------------------------------------------------------------------


def hf_schedule(initial: int, schedule: str) -> AssistedCandidateGenerator:
    """HF's generator with only what ``update_candidate_strategy`` reads (no assistant model)."""
    generator = object.__new__(AssistedCandidateGenerator)
    generator.assistant_generation_config = GenerationConfig(
        num_assistant_tokens=initial, num_assistant_tokens_schedule=schedule, assistant_confidence_threshold=0.4
    )
    generator.num_assistant_tokens = initial
    return generator


@pytest.mark.parametrize("schedule", ["constant", "heuristic", "heuristic_transient"])
def test_schedule_follows_hf_update_candidate_strategy(schedule):
    rng = random.Random(2)
    ours = DraftSchedule(5, schedule, backoff=None)
    hf = hf_schedule(5, schedule)
    for _ in range(300):
        assert ours.next_num_tokens() == int(hf.num_assistant_tokens)
        drafted = rng.choice([0, ours.next_num_tokens(), rng.randrange(0, 8)])
        accepted = rng.choice([drafted, rng.randrange(0, drafted + 1)])
        scores = torch.zeros(1, drafted + 1, 4)  # HF reads the candidate count from len(scores[0]) - 1
        hf.update_candidate_strategy(torch.zeros(1, 3, dtype=torch.long), scores, accepted)
        ours.record(drafted, accepted)
    assert ours.num_assistant_tokens == hf.num_assistant_tokens


def test_schedule_rules_and_limits():
    schedule = DraftSchedule(3, "heuristic", backoff=None)
    schedule.record(3, 3)
    assert schedule.next_num_tokens() == 5
    schedule.record(5, 1)
    schedule.record(4, 0)
    schedule.record(3, 0)
    schedule.record(2, 0)
    schedule.record(1, 0)
    assert schedule.next_num_tokens() == 1  # floor 1
    schedule.record(0, 0)  # HF: a round without drafts counts as "all accepted"
    assert schedule.next_num_tokens() == 3
    assert schedule.value_to_persist() == 3
    # HF's _calculate_new_tokens: the target's own token takes the last position
    assert schedule.next_num_tokens(cur_len=10, max_length=12) == 1
    assert schedule.next_num_tokens(cur_len=11, max_length=12) == 0
    # transient: every request starts again from the initial value, nothing is carried over
    assert DraftSchedule(3, "heuristic_transient").value_to_persist() is None
    assert DraftSchedule(3, "constant").value_to_persist() is None
    with pytest.raises(ValueError):
        DraftSchedule(3, "adaptive")
    with pytest.raises(ValueError):
        schedule.record(2, 3)


def test_confidence_stop_matches_hf_confidence_criteria():
    generator = torch.Generator().manual_seed(3)
    for threshold in (0.05, 0.2, 0.4, 0.9):
        for _ in range(40):
            scores = 3 * torch.randn(1, 10, generator=generator)  # [1, vocab_size] processed scores
            token = int(torch.randint(10, (1,), generator=generator))
            hf = ConfidenceCriteria(threshold)(torch.tensor([[1, 2, token]]), (scores,))
            assert should_stop_drafting(scores[0].softmax(-1), token, threshold) == bool(hf)
    probs = torch.tensor([0.9, 0.1])
    assert not should_stop_drafting(probs, 1, None) and not should_stop_drafting(probs, 1, 0.0)


def run_backoff(schedule: DraftSchedule, accepts, steps: int) -> list[int]:
    """Drive a schedule: ``accepts(step, num_drafts)`` says how many drafts the target keeps."""
    counts = []
    for step in range(steps):
        count = schedule.next_num_tokens()
        counts.append(count)
        schedule.record(count, accepts(step, count) if count else 0)
    return counts


def test_backoff_pauses_and_probes_with_doubling_pauses():
    policy = BackoffPolicy(
        min_acceptance_rate=0.3, draft_token_cost=0.05, window=4, probe_window=1, initial_pause=8, max_pause=64
    )
    schedule = DraftSchedule(4, "constant", backoff=policy)
    counts = run_backoff(schedule, lambda step, n: 0, 4 + 8 + 1 + 16 + 1 + 32 + 1 + 64 + 1 + 64)
    expected = [4] * 4 + [0] * 8 + [4] + [0] * 16 + [4] + [0] * 32 + [4] + [0] * 64 + [4] + [0] * 64
    assert counts == expected
    assert schedule.num_pauses == 5

    # a probe that lands ends the back-off: full window again, next failure pauses 8 steps again
    def recovering(step: int, n: int) -> int:
        return n if 12 <= step < 40 else 0

    schedule = DraftSchedule(4, "constant", backoff=policy)
    counts = run_backoff(schedule, recovering, 60)
    assert schedule.num_pauses == 3  # 0-3 failed, 41-44 failed, the probe at 53 failed
    assert counts[:12] == [4] * 4 + [0] * 8
    assert counts[12:40] == [4] * 28  # probe at step 12 succeeded, then drafting continued
    # blocks of 4 rounds from the probe on: 13-16, ..., 37-40 (3 good, 1 failed: fine); 41-44
    # all fail, so drafting pauses again, for the initial 8 steps
    assert counts[40:45] == [4] * 5 and counts[45:53] == [0] * 8 and counts[53] == 4


def test_backoff_pause_covers_an_expensive_probe():
    # a draft model costing 0.5 target steps per draft token: two rounds of 6 failed drafts waste 6
    # steps, so the pause lasts 6 / 0.1 = 60 steps; a failed probe (3 steps) needs only 30, but
    # the doubling gives 120
    policy = BackoffPolicy(draft_token_cost=0.5, window=2, probe_window=1, initial_pause=4)
    schedule = DraftSchedule(6, "constant", backoff=policy)
    counts = run_backoff(schedule, lambda step, n: 0, 200)
    assert counts[:2] == [6, 6] and counts[2:62] == [0] * 60 and counts[62] == 6
    assert counts[63:183] == [0] * 120 and counts[183] == 6


def test_backoff_is_deterministic_and_leaves_good_requests_alone():
    def accepts_with(seed: int):
        rng = random.Random(seed)

        def accepts(step: int, n: int) -> int:  # each draft kept with probability 0.8, up to a rejection
            kept = 0
            while kept < n and rng.random() < 0.8:
                kept += 1
            return kept

        return accepts

    first = run_backoff(DraftSchedule(5, "heuristic"), accepts_with(4), 400)
    assert first == run_backoff(DraftSchedule(5, "heuristic"), accepts_with(4), 400)
    assert first != run_backoff(DraftSchedule(5, "heuristic"), accepts_with(5), 400)
    assert 0 not in first


@pytest.mark.parametrize("acceptance", [0.0, 0.05, 0.15, 0.3, 0.6])
@pytest.mark.parametrize("schedule_name,cost", [("constant", 0.1), ("heuristic", 0.1), ("constant", 0.4)])
def test_backoff_bounds_cost_against_plain_greedy(acceptance, schedule_name, cost):
    """Cost model of ``BackoffPolicy``: a step costs 1 + drafts * cost target steps and emits
    accepted + 1 tokens; plain greedy costs 1 step per token. Over a long request the assisted one
    costs at most ~10 % more per token, whatever the drafts' acceptance."""
    rng = random.Random(5)
    schedule = DraftSchedule(5, schedule_name, backoff=BackoffPolicy(draft_token_cost=cost))
    spent = emitted = 0.0
    while emitted < 3000:
        count = schedule.next_num_tokens()
        kept = 0
        while kept < count and rng.random() < acceptance:
            kept += 1
        schedule.record(count, kept)
        spent += 1 + count * cost
        emitted += kept + 1
    assert spent / emitted <= 1.10, (spent / emitted, schedule.num_pauses)


# --- universal assisted decoding: alignment --------------------------------------------------------


def test_longest_diagonal_matches_hf_on_random_matrices():
    generator = torch.Generator().manual_seed(6)
    for _ in range(300):
        rows, cols = (int(x) for x in torch.randint(1, 9, (2,), generator=generator))
        density = float(torch.rand(1, generator=generator))
        match = (torch.rand(rows, cols, generator=generator) < density).to(int)
        hf_runs = UAD._get_longest_diag_dict(match, match.nonzero())
        assert longest_diagonal_runs(match) == {tuple(k.tolist()): v for k, v in hf_runs.items()}
        if match.any():
            start, length = UAD._get_longest_diag_index(match)
            assert longest_diagonal(match) == (tuple(start.tolist()), length)
        else:
            assert longest_diagonal(match) is None


def test_split_tokens_matches_hf_get_tokens_diag():
    rng = random.Random(7)
    for _ in range(500):
        vocab = rng.choice([3, 6, 20])
        known = [rng.randrange(vocab) for _ in range(rng.randrange(0, 12))]
        keep = rng.randrange(0, len(known) + 1)
        reencoded = known[len(known) - keep :][rng.randrange(0, 3) :] + [rng.randrange(vocab) for _ in range(5)]
        reencoded = reencoded[: rng.randrange(0, len(reencoded) + 1)]
        hf = UAD._get_tokens_diag(torch.tensor([known]), torch.tensor([reencoded]))
        ours = split_tokens(known, reencoded)
        if hf[0] is None:
            assert ours is None
        else:
            assert (ours.discrepancy_length, ours.new_ids, ours.discrepancy_ids) == (
                hf[0],
                hf[1][0].tolist(),
                hf[2][0].tolist(),
            )


CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away quickly!",
    "Speculative decoding drafts several tokens cheaply and lets the large model verify them at once.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Numbers: 12345, 6789.0 and 3.14159; dates like 2024-05-01 and times like 12:30.",
    "Hello world! Hello again, world. Tokenizers split words into pieces: un-believ-able, re-encode.",
]
STORY = " ".join(CORPUS * 2) + " The end of the story comes after the fox and the dog made peace."


def trained_tokenizer(vocab_size: int, bos: bool):
    """A byte-level BPE trained here, wrapped as an HF tokenizer (``bos``: adds <s> like Gemma)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS * 3, trainer=trainer)
    if bos:
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def trained_pair():
    return trained_tokenizer(300, bos=False), trained_tokenizer(420, bos=True)


def real_tokenizer_folder(pattern: str) -> Path:
    folders = sorted(glob.glob(str(Path.home() / ".cache" / "decoda" / "models" / pattern / "tokenizer.json")))
    if not folders:
        pytest.skip(f"no converted {pattern} folder in ~/.cache/decoda (start the server once to create it)")
    return Path(folders[0]).parent


@pytest.fixture(scope="module")
def real_pair():
    """SmolLM2 (target) and Gemma 3 270M (assistant): the real models' tokenizers, from the folders
    Decoda converts the packaged GGUFs into."""
    from transformers import AutoTokenizer

    smollm2 = AutoTokenizer.from_pretrained(real_tokenizer_folder("smollm2-135m-instruct-*"))
    gemma = AutoTokenizer.from_pretrained(real_tokenizer_folder("gemma3-270m-*"))
    return smollm2, gemma


def hf_aligner(target_tokenizer, assistant_tokenizer, max_length: int) -> UAD:
    """HF's generator with only what its alignment methods read (no assistant model)."""
    hf = object.__new__(UAD)
    hf.target_tokenizer, hf.assistant_tokenizer = target_tokenizer, assistant_tokenizer
    hf.prev_target_ids_len, hf.prev_assistant_ids = None, None
    hf.target_lookbehind = hf.assistant_lookbehind = 10
    hf.main_model_max_length = max_length
    return hf


def simulate_against_hf(target_tokenizer, assistant_tokenizer, text: str, seed: int) -> int:
    """Run HF's ``get_candidates`` bookkeeping and ``UniversalAligner`` side by side on a text the
    target "generates" token by token: drafts are the assistant's encoding of the true
    continuation (re-encoded out of context, so token boundaries move), sometimes corrupted; the
    target keeps a random prefix of the drafts plus one token. Returns how many rounds drafted."""
    rng = random.Random(seed)
    reference = target_tokenizer(text)["input_ids"]
    max_length = len(reference) - rng.randrange(0, 4)
    position = rng.randrange(2, 12)
    ours = UniversalAligner(target_tokenizer, assistant_tokenizer)
    hf = hf_aligner(target_tokenizer, assistant_tokenizer, max_length)
    rounds = 0
    while position < max_length - 1:
        target_ids = reference[:position]
        input_ids = torch.tensor([target_ids])
        hf_assistant_ids, hf_remove = hf._prepare_assistant_input_ids(input_ids)
        hf.prev_assistant_ids = hf_assistant_ids.clone()
        prepared = ours.assistant_input(target_ids)
        assert (prepared.token_ids, prepared.remove_from_pkv) == (hf_assistant_ids[0].tolist(), hf_remove)
        assert prepared.token_ids[: prepared.num_unchanged] == hf_assistant_ids[0, : prepared.num_unchanged].tolist()

        continuation = target_tokenizer.decode(reference[position : position + rng.randrange(1, 8)])
        drafts = assistant_tokenizer(continuation, add_special_tokens=False)["input_ids"][: rng.randrange(1, 9)]
        if rng.random() < 0.3:
            drafts = drafts[: rng.randrange(0, len(drafts) + 1)] + [rng.randrange(len(assistant_tokenizer))]
        sequence = torch.tensor([prepared.token_ids + drafts])
        hf_new = hf._process_assistant_outputs(input_ids, sequence)
        hf.prev_target_ids_len, hf.prev_assistant_ids = input_ids.shape[1], sequence
        target_drafts = ours.target_drafts(target_ids, drafts, max_length=max_length)
        assert target_drafts == hf_new[0, len(target_ids) :].tolist()
        rounds += bool(target_drafts)
        position += rng.randrange(1, len(target_drafts) + 2)
    return rounds


def test_retokenize_matches_hf(trained_pair):
    target, assistant = trained_pair
    for text in CORPUS:
        ids = target(text)["input_ids"]
        hf = UAD.convert_source_tokens_to_target_tokens(None, torch.tensor([ids]), target, assistant)
        assert retokenize(ids, target, assistant) == hf[0].tolist()
        assert retokenize(ids, target, assistant)[0] == assistant.bos_token_id  # HF adds special tokens


def test_universal_alignment_matches_hf_with_trained_tokenizers(trained_pair):
    target, assistant = trained_pair
    assert len(target) != len(assistant)
    drafted = 0
    for seed in range(3):
        drafted += simulate_against_hf(target, assistant, STORY, seed)
        drafted += simulate_against_hf(assistant, target, STORY, 100 + seed)
    assert drafted > 30


@pytest.mark.slow
def test_universal_alignment_matches_hf_with_smollm2_and_gemma(real_pair):
    """Uses the real models' tokenizer files (SmolLM2 target, Gemma 3 270M assistant, and back)."""
    smollm2, gemma = real_pair
    text = STORY + " Ünïcödé: naïve café — 東京 🙂 and emoji 🚀🚀 keep byte fallback busy.\n\n\tIndented."
    drafted = 0
    for seed in range(4):
        drafted += simulate_against_hf(smollm2, gemma, text, seed)
        drafted += simulate_against_hf(gemma, smollm2, text, 50 + seed)
    assert drafted > 20


def test_aligner_first_round_reencodes_everything_then_only_a_window(trained_pair):
    target, assistant = trained_pair
    ids = target(STORY)["input_ids"]
    aligner = UniversalAligner(target, assistant)
    first = aligner.assistant_input(ids[:30])
    assert first.token_ids == retokenize(ids[:30], target, assistant)
    words = assistant(target.decode(ids[30:34]), add_special_tokens=False)["input_ids"]
    drafts = aligner.target_drafts(ids[:30], words)
    assert drafts and math.isclose(len(drafts), 4, abs_tol=3)
    later = aligner.assistant_input(ids[:32])
    # the window re-encoding (with its BOS) aligned onto the known ids: no BOS in the middle
    assert later.token_ids.count(assistant.bos_token_id) == 1
    assert later.num_unchanged >= len(first.token_ids) - 3
