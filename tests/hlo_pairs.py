"""Verifying a pair of HLO module texts written to files, for the HLO op tests
(test_hlo_sort.py, test_hlo_batchnorm.py, test_hlo_custom_neuron.py)."""
from pathlib import Path

from rulekit import assert_views_hold

from dlverify.hlo_api import verify_hlo


def verify_texts(tmp_path: Path, seq: str, dist: str):
    """The verdict on `dist` (written to tmp_path/dist.hlo) against `seq`."""
    seq_path, dist_path = tmp_path / "seq.hlo", tmp_path / "dist.hlo"
    seq_path.write_text(seq)
    dist_path.write_text(dist)
    return verify_hlo(seq_path, dist_path)


def assert_pair_verifies(tmp_path: Path, seq: str, dist: str, outputs: list[str]):
    """The pair verifies with exactly these output reconstructions, and every
    derived view holds on random inputs."""
    res = verify_texts(tmp_path, seq, dist)
    assert res.verified, [f.message for f in res.failures[:3]]
    assert res.outputs == outputs
    assert_views_hold(res.problem, res.views, seeds=(0,), padded=res.padded_views)
    return res
