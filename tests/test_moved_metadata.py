"""An instruction XLA left without metadata, located at the user frames of the
layout-only reader it moved the metadata to (frontends/hlo/moved_metadata.py): the
convolutions of the compiled CNN examples, whose transposes back to the program's
layout carry `conv_general_dilated`; and the cases where nothing may be borrowed."""
from pathlib import Path

from hlo_pairs import assert_compiled_case_and_twin, example_module

from dlverify.frontends.hlo.lower import hlo_to_graph
from dlverify.frontends.hlo.parse import parse_hlo_module
from dlverify.ir import IdAllocator

FRAMES = """FileNames
1 "/src/model.py"

FunctionNames
1 "conv_block"
2 "act"

FileLocations
1 {file_name_id=1 function_name_id=1 line=42 end_line=42 column=1 end_column=1}
2 {file_name_id=1 function_name_id=2 line=50 end_line=50 column=1 end_column=1}

StackFrames
1 {file_location_id=1 parent_frame_id=0}
2 {file_location_id=2 parent_frame_id=0}

"""

CONV = ('%conv = f32[1,4,4,2]{3,2,1,0} convolution(%x, %w), window={size=1x1}, '
        'dim_labels=b01f_01io->b01f')


def _module(reader_md: str, extra_reader: bool = False, reader_op: str = "transpose") -> str:
    """A convolution without metadata read by a fusion transposing it back, whose
    transpose carries `reader_md`; `extra_reader`: the convolution is read twice."""
    op = ("transpose(%p), dimensions={0,3,1,2}" if reader_op == "transpose"
          else "negate(%p)")
    shape = "f32[1,2,4,4]" if reader_op == "transpose" else "f32[1,4,4,2]"
    root = "%f" if not extra_reader else "(%f, %conv)"
    root_shape = shape if not extra_reader else f"({shape}, f32[1,4,4,2])"
    root_ins = (f"ROOT %out = {root_shape} tuple{root}" if extra_reader
                else f"ROOT %out = {shape} copy(%f)")
    return f"""HloModule m, entry_computation_layout={{(f32[1,4,4,3], f32[1,1,3,2])->{root_shape}}}

{FRAMES}
%fused (p: f32[1,4,4,2]) -> {shape} {{
  %p = f32[1,4,4,2]{{3,2,1,0}} parameter(0)
  ROOT %t = {shape} {op}, {reader_md}
}}

ENTRY %main (x: f32[1,4,4,3], w: f32[1,1,3,2]) -> {root_shape} {{
  %x = f32[1,4,4,3]{{3,2,1,0}} parameter(0)
  %w = f32[1,1,3,2]{{3,2,1,0}} parameter(1)
  {CONV}
  %f = {shape} fusion(%conv), kind=kLoop, calls=%fused
  {root_ins}
}}
"""


def _conv_frames(tmp_path: Path, text: str) -> set[tuple[str, int, str]]:
    """The frames of the ops lowered from %conv (its own line leads each)."""
    path = tmp_path / "m.hlo"
    path.write_text(text)
    module = parse_hlo_module(text, str(path))
    graph, _ = hlo_to_graph(module, IdAllocator(), "m", instruction_frames=True)
    conv = [op.loc.frames for op in graph.ops if op.loc.frames and op.loc.frames[0].function == "conv"]
    assert conv
    return {(Path(f.file).name, f.line, f.function) for frames in conv for f in frames}


def test_metadata_moved_to_the_transpose_back_locates_the_convolution(tmp_path):
    frames = _conv_frames(tmp_path, _module(
        'metadata={op_name="jit(f)/conv_general_dilated" stack_frame_id=1}'))
    assert ("model.py", 42, "conv_block") in frames
    # labelled: the reader whose metadata it is, at its own line in the module
    assert any(fn == "metadata of %t" and name == "m.hlo" for name, _, fn in frames)


def test_nothing_borrowed_from_a_reader_naming_another_primitive(tmp_path):
    frames = _conv_frames(tmp_path, _module(
        'metadata={op_name="jit(f)/act/transpose" stack_frame_id=2}'))
    assert {name for name, _, _ in frames} == {"m.hlo"}


def test_nothing_borrowed_through_a_reader_that_computes(tmp_path):
    frames = _conv_frames(tmp_path, _module(
        'metadata={op_name="jit(f)/conv_general_dilated" stack_frame_id=1}', reader_op="negate"))
    assert {name for name, _, _ in frames} == {"m.hlo"}


def test_nothing_borrowed_when_the_value_has_two_readers(tmp_path):
    frames = _conv_frames(tmp_path, _module(
        'metadata={op_name="jit(f)/conv_general_dilated" stack_frame_id=1}', extra_reader=True))
    assert {name for name, _, _ in frames} == {"m.hlo"}


def test_compiled_channel_parallel_cnn_missing_psum_is_located(tmp_path):
    """%convolution.1 (the second conv, summing this rank's channels only) has no
    metadata; the transpose fusion after it has conv_general_dilated's."""
    cp = example_module("conv_parallel")
    assert_compiled_case_and_twin(tmp_path, cp.conv_channel_parallel(),
                                  cp.conv_channel_parallel_bug_missing_psum(), dumped=True)


def test_compiled_causal_conv_restarting_per_shard_is_located(tmp_path):
    """The depthwise causal conv padded with zeros on every shard: its transpose back
    sits inside the silu fusion that reads it, reached through the fusion parameter."""
    cp = example_module("conv_parallel")
    assert_compiled_case_and_twin(tmp_path, cp.causal_conv_halo(),
                                  cp.causal_conv_bug_restarts_per_shard(), dumped=True)
