"""dlverify.numeric.value_error: the measure every numeric soundness check and
witness compares against a tolerance. A NaN must never pass such a check."""
import numpy as np

from dlverify.numeric import value_error


def test_equal_values_and_equal_non_finite_values_agree():
    a = np.array([1.0, np.nan, np.inf, -np.inf])
    assert value_error(a, a.copy()) == 0.0
    assert value_error(np.zeros((0, 3)), np.zeros((0, 3))) == 0.0


def test_a_nan_on_one_side_or_a_different_infinity_is_an_infinite_error():
    tol = 1e-6
    for got, want in [([1.0, np.nan], [1.0, 2.0]), ([1.0, 2.0], [np.nan, 2.0]),
                      ([np.inf], [-np.inf]), ([np.inf], [1.0])]:
        err = value_error(np.array(got), np.array(want))
        assert err == np.inf and not err <= tol, (got, want)


def test_finite_differences_are_the_largest_absolute_difference():
    assert value_error(np.array([1.0, 2.0, 3.5]), np.array([1.0, 2.5, 3.0])) == 0.5
