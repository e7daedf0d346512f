"""evaluation.stats: Wilson's interval on published values, the exact McNemar test, Newcombe's interval,
and the verdict rule on before/after pairs."""

from __future__ import annotations

import math

import pytest

from swarm_node.evaluation.stats import (
    IMPROVED,
    NO_CHANGE,
    PAIRED,
    UNPAIRED,
    WORSE,
    Accuracy,
    compare,
    mcnemar_p,
    newcombe_difference,
    paired_counts,
    wilson,
)


def test_wilson_matches_published_values():
    # Newcombe (1998), Statistics in Medicine 17:857, table I: 81/263 -> 0.2553-0.3662, 15/148 -> 0.0624-0.1605,
    # 0/20 -> 0-0.1611, 1/29 -> 0.0061-0.1718
    for (k, n), (lo, hi) in {(81, 263): (0.2553, 0.3662), (15, 148): (0.0624, 0.1605), (0, 20): (0.0, 0.1611),
                             (1, 29): (0.0061, 0.1718)}.items():
        assert wilson(k, n) == pytest.approx((lo, hi), abs=1e-4), (k, n)
    assert wilson(10, 10) == (pytest.approx(0.7225, abs=1e-4), 1.0)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)  # symmetric around 0.5


def test_wilson_of_a_64_problem_evaluation_is_about_a_tenth_either_side():
    lo, hi = wilson(15, 64)  # make run's 0.234
    assert (round(lo, 3), round(hi, 3)) == (0.147, 0.351)
    assert Accuracy(15, 64).text() == "0.234 [0.147, 0.351]"


def test_wilson_refuses_impossible_counts():
    for k, n in ((1, 0), (-1, 5), (6, 5)):
        with pytest.raises(ValueError):
            wilson(k, n)


def test_mcnemar_exact_p_values():
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(5, 5) == 1.0
    assert mcnemar_p(10, 0) == pytest.approx(2 / 2**10)  # 2 x P(X <= 0), X ~ Bin(10, 1/2)
    assert mcnemar_p(11, 3) == pytest.approx(2 * sum(math.comb(14, i) for i in range(4)) / 2**14)  # 0.0574
    assert mcnemar_p(3, 11) == mcnemar_p(11, 3)
    assert mcnemar_p(1, 0) == 1.0  # capped at 1


def test_newcombe_difference_matches_the_published_example():
    # Newcombe (1998) table II, example (e): 56/70 vs 48/80, difference 0.1833 with 95% CI 0.0524 to 0.3339
    lo, hi = newcombe_difference(Accuracy(48, 80), Accuracy(56, 70))
    assert (lo, hi) == pytest.approx((0.0524, 0.3339), abs=1e-4)


def test_paired_verdicts_follow_the_discordant_problems():
    before = "0" * 40 + "1" * 24
    gained_12 = "1" * 12 + "0" * 28 + "1" * 24  # 12 wrong -> right, none lost: p = 2/4096
    change = compare(Accuracy(24, 64), Accuracy(36, 64), (before, gained_12))
    assert (change.verdict, change.test, change.gained, change.lost) == (IMPROVED, PAIRED, 12, 0)
    assert change.p_value == pytest.approx(2 / 2**12)
    assert change.text() == "improved (+0.188; 12 problems gained, 0 lost, exact McNemar p=0.000488)"
    lost_12 = "0" * 52 + "1" * 12
    assert compare(Accuracy(24, 64), Accuracy(12, 64), (before, lost_12)).verdict == WORSE
    # the same accuracies, but 10 gained and 4 lost: p = 0.18, within the noise
    churn = "1" * 10 + "0" * 30 + "0" * 4 + "1" * 20
    change = compare(Accuracy(24, 64), Accuracy(30, 64), (before, churn))
    assert (change.gained, change.lost, change.verdict) == (10, 4, NO_CHANGE)
    assert change.p_value == pytest.approx(mcnemar_p(10, 4)) and change.p_value > 0.05


def test_make_runs_two_readings_are_told_apart_by_the_unpaired_rule():
    # the fresh-clone runs, 64 problems: 0.234 -> 0.609 is a change, 0.234 -> 0.172 is not
    up = compare(Accuracy(15, 64), Accuracy(39, 64))
    down = compare(Accuracy(15, 64), Accuracy(11, 64))
    assert (up.verdict, up.test) == (IMPROVED, UNPAIRED) and up.diff_lo > 0
    assert down.verdict == NO_CHANGE and down.diff_lo < 0 < down.diff_hi
    assert compare(Accuracy(39, 64), Accuracy(15, 64)).verdict == WORSE


def test_outcomes_of_other_lengths_are_not_paired():
    with pytest.raises(ValueError, match="not paired"):
        paired_counts("0101", "010")
