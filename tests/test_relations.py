"""Input/output relations from partition specs."""
import pytest

from dlverify.errors import InputError
from dlverify.ir import Mesh
from dlverify.relations import spec_relation, split_relation


def test_spec_on_2d_mesh():
    mesh = Mesh(("dp", "tp"), (2, 4))
    rel = spec_relation((8, 16), ("dp", "tp"), mesh, "x")
    assert rel.dist_shape == (4, 4)
    # rank = dp * 4 + tp
    assert rel.offsets[0] == (0, 0)
    assert rel.offsets[3] == (0, 12)
    assert rel.offsets[5] == (4, 4)


def test_spec_with_axis_tuple_is_major_to_minor():
    mesh = Mesh(("a", "b"), (2, 2))
    rel = spec_relation((8,), (("b", "a"),), mesh, "x")
    # index along dim 0 = b * 2 + a
    assert [o[0] for o in rel.offsets] == [0, 4, 2, 6]


def test_replicated_and_uneven():
    mesh = Mesh(("x",), (4,))
    assert spec_relation((6, 2), (), mesh, "x").is_replicated()
    with pytest.raises(InputError, match="does not split evenly"):
        spec_relation((6, 2), ("x",), mesh, "in_specs[0]")
    with pytest.raises(InputError, match="mesh axis 'y'"):
        spec_relation((8,), ("y",), mesh, "in_specs[0]")


def test_mesh_groups():
    mesh = Mesh(("dp", "tp"), (2, 2))
    assert mesh.groups(("tp",)) == [[0, 1], [2, 3]]
    assert mesh.groups(("dp",)) == [[0, 2], [1, 3]]
    assert mesh.groups(("dp", "tp")) == [[0, 1, 2, 3]]


def test_split_relation():
    rel = split_relation((4, 6), 1, 3)
    assert rel.dist_shape == (4, 2)
    assert rel.offsets == ((0, 0), (0, 2), (0, 4))
