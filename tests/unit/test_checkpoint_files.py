"""A ``--save`` folder's files without a training: the manifest and its verification, which
saves retention keeps and its read lock, the layout (marker, completed saves, the train state
of older formats), what a resume must match (compatibility) and the run's own saves
(megatron_ext/checkpoint/manifest.py, retention.py, layout.py, compatibility.py, resume.py)."""

from __future__ import annotations

import json
import os
import re

import pytest

from conftest import TINY_RUN
from helpers.checkpoint_files import write_save
from megatron_ext.checkpoint import compatibility, layout, loading, manifest, retention
from megatron_ext.checkpoint.layout import MARKER, TrainState
from megatron_ext.checkpoint.resume import own_saves
from megatron_ext.checkpoint.saved_args import with_checkpoint_args
from megatron_ext.config.arguments import read_training_flags
from megatron_ext.config.flag_fields import RESUME_KINDS
from megatron_ext.config.run_config import RunConfig, fields_where
from megatron_ext.runtime.errors import CheckpointError
from megatron_ext.runtime.megatron_compat import installed_release, null_tokenizer_counts


def test_the_manifest_names_a_flipped_byte_a_truncated_and_a_missing_file(tmp_path):
    path = write_save(tmp_path, 5)
    assert sorted(manifest.verify(path)) == ["__0_0.distcp", "common.pt"]
    shard = os.path.join(path, "__0_0.distcp")
    data = bytearray(open(shard, "rb").read())
    data[1234] ^= 0x01
    open(shard, "wb").write(bytes(data))
    with pytest.raises(manifest.DamagedCheckpoint, match=f"{shard}: checksum .* changed"):
        manifest.verify(path)
    open(shard, "wb").write(bytes(data[:2000]))
    with pytest.raises(manifest.DamagedCheckpoint, match=f"{shard}: 2000 bytes, the manifest "
                                                         f"says 3000"):
        manifest.verify(path)
    os.remove(shard)
    with pytest.raises(manifest.DamagedCheckpoint, match=f"{shard}: missing"):
        manifest.verify(path)


@pytest.mark.parametrize("keep_last, keep_every, deleted", [
    (1, None, [1, 2, 3, 4, 5]),
    (2, None, [1, 2, 3, 4]),
    (1, 2, [1, 3, 5]),
    (10, None, []),
])
def test_retention_keeps_the_newest_and_every_kth(keep_last, keep_every, deleted):
    # 8 is newer than the marker (a save completed but not yet named): never deleted.
    assert retention.to_delete([1, 2, 3, 4, 5, 6, 8], 6, keep_last, keep_every) == deleted


def test_retention_deletes_nothing_a_study_evaluation_is_reading(tmp_path):
    for i in (1, 2, 3):
        write_save(tmp_path, i)
    (tmp_path / "iter_0000004.partial").mkdir()  # a save being written
    logged = []
    with retention.reading(str(tmp_path), 1):  # as megatron_ext/study/evaluation.py reads
        assert retention.prune(str(tmp_path), 3, 1, None, logged.append) == [2]
    assert f"[fixedcode] retention: kept {tmp_path}/iter_0000001: a reader holds its lock" \
        in logged
    # The lock lies in .locks/, not beside the saves: the listing is Megatron-LM's.
    assert sorted(os.listdir(tmp_path)) == sorted([MARKER, retention.LOCKS, "iter_0000001",
                                                   "iter_0000003", "iter_0000004.partial"])
    assert os.listdir(tmp_path / retention.LOCKS) == ["iter_0000001.lock"]
    # Once read, it goes; a reader that comes after the deletion is told so.
    assert retention.prune(str(tmp_path), 3, 1, None, logged.append) == [1]
    with pytest.raises(retention.SaveDeleted, match="iter_0000001: deleted"):
        with retention.reading(str(tmp_path), 1):
            pass


def test_a_deletion_killed_midway_leaves_loadable_saves(tmp_path, monkeypatch):
    for i in (1, 2, 3):
        write_save(tmp_path, i)

    def killed(path, *args, **kwargs):
        raise KeyboardInterrupt  # the process dies inside the removal

    monkeypatch.setattr(retention.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        retention.prune(str(tmp_path), 3, 1, None, print)
    monkeypatch.undo()
    # The save being deleted was renamed first: nothing lists or loads it, the rest verify.
    assert layout.completed_iterations(str(tmp_path)) == [2, 3]
    assert (tmp_path / "iter_0000001.deleting").is_dir()
    for i in (2, 3):
        assert loading.check_save(str(tmp_path), i).startswith("ok: ")
    retention.prune(str(tmp_path), 3, 1, None, print)  # finishes the interrupted deletion
    assert sorted(os.listdir(tmp_path)) == sorted([MARKER, retention.LOCKS, "iter_0000003"])


def test_a_damaged_manifest_is_a_checkpoint_error_and_an_old_save_is_not_verified(tmp_path):
    path = write_save(tmp_path, 2)
    (tmp_path / "iter_0000002" / manifest.MANIFEST).write_text("{not json")
    with pytest.raises(CheckpointError, match="manifest.json: unreadable manifest"):
        manifest.verify(path)
    os.remove(os.path.join(path, manifest.MANIFEST))  # a save written before manifests
    assert manifest.verify(path) is None


def test_the_marker_names_the_latest_completed_save(tmp_path):
    save = str(tmp_path)
    assert layout.latest_iteration(save) is None and layout.completed_iterations(save) == []
    for i in (2, 4):
        write_save(tmp_path, i)
    write_save(tmp_path, 6, marker=False)  # completed after the marker: not yet the latest
    (tmp_path / "iter_0000008.partial").mkdir()
    assert layout.latest_iteration(save) == 4
    assert layout.completed_iterations(save) == [2, 4]
    assert layout.existing_save(save) == (f"{save}/iter_0000004", 4)
    assert layout.existing_save(save, 2) == (f"{save}/iter_0000002", 2)
    with pytest.raises(CheckpointError, match=f"checkpoint {save}/iter_0000003 does not exist"):
        layout.existing_save(save, 3)
    (tmp_path / MARKER).write_text("four")
    with pytest.raises(CheckpointError, match="expected an iteration number, found 'four'"):
        layout.latest_iteration(save)
    (tmp_path / MARKER).write_text("10")
    with pytest.raises(CheckpointError, match="names iteration 10, but .*iter_0000010 is "
                                              "missing"):
        layout.latest_iteration(save)


def test_the_train_state_of_an_older_checkpoint_reads_its_missing_fields_as_defaults():
    """Format 1 had no validation_pending nor skip counts: they read as none pending, none
    skipped; a current checkpoint's fields are read as saved."""
    assert TrainState.from_common({"iteration": 7, "consumed_train_samples": 28}) == \
        TrainState(iteration=7, consumed_train_samples=28)
    state = TrainState(3, 12, nonfinite_skipped=1, overflow_skipped=2, validation_pending=True)
    assert TrainState.from_common({**vars(state), "args": {}}) == state


def test_the_content_metadata_names_the_distributed_optimizers_layout():
    plain = RunConfig().replace(use_distributed_optimizer=False,
                                dist_ckpt_optim_fully_reshardable=False)
    assert "distrib_optim_sharding_type" not in layout.content_metadata(plain)
    for fully, kind in ((False, "dp_reshardable"), (True, "fully_reshardable")):
        sharded = RunConfig().replace(use_distributed_optimizer=True,
                                      dist_ckpt_optim_fully_reshardable=fully)
        assert layout.content_metadata(sharded)["distrib_optim_sharding_type"] == kind


def saved_args(*flags: str) -> dict:
    """A checkpoint's args as a run of TINY_RUN and ``flags`` records them."""
    return {**read_training_flags([*TINY_RUN, "--train-iters", "8", *flags]).record(),
            "padded_vocab_size": 512, "global_batch_size": 4, "train_iters": 8}


def test_a_resume_refuses_another_model_or_precision_naming_each_flag():
    saved = saved_args("--input-interface", "gf2")
    compatibility.check_compatible(saved, saved, "CKPT")
    with pytest.raises(CheckpointError, match="cannot resume CKPT with a different model or "
                                              "input:\n  --input-interface: checkpoint 'gf2', "
                                              "now 'binary'\n  --code-bits: checkpoint 16, "
                                              "now 12"):
        compatibility.check_compatible(saved, {**saved, "input_interface": "binary",
                                               "code_bits": 12}, "CKPT")
    with pytest.raises(CheckpointError, match=r"in another precision (?s:.*)--bf16: checkpoint "
                                              r"False, now True"):
        compatibility.check_compatible(saved, {**saved, "bf16": True}, "CKPT")


def test_a_padded_vocabulary_changed_by_the_null_tokenizer_release_is_named(tmp_path):
    """A NullTokenizer save of the other side of megatron-core 0.18.0 pads --vocab-size 512
    to another size (513 ids before it: 640; 512 from it: 512): the refusal names the
    release difference, the release the save's manifest records and the --vocab-size that
    resumes it; a padding that differs for another reason gets no such line."""
    here, _ = null_tokenizer_counts(512)
    there = 1025 - here  # 513 <-> 512
    padded = {513: 640, 512: 512}
    current = {**saved_args("--vocab-size", "512"), "padded_vocab_size": padded[here]}
    saved = {**current, "padded_vocab_size": padded[there]}
    written = "0.16.1" if there == 513 else "0.19.2"
    manifest.write_manifest(str(tmp_path), {}, written_by=written)
    with pytest.raises(CheckpointError) as refused:
        compatibility.check_compatible(saved, current, str(tmp_path))
    assert str(refused.value).endswith(
        f"--padded-vocab-size: checkpoint {padded[there]}, now {padded[here]}\n  a megatron-core "
        f"release difference: NullTokenizer's vocabulary changed in megatron-core 0.18.0 "
        f"(NullTokenizer(512) counts 513 ids before it, 512 from it); this save was written "
        f"with megatron-core {written}, this run has {installed_release()}: resume it with "
        f"--vocab-size {512 + there - here}, whose NullTokenizer here has the save's {there} ids")
    for other in ({"make_vocab_size_divisible_by": 64}, {"vocab_size": 500},
                  {"tokenizer_type": "HuggingFaceTokenizer"}):
        with pytest.raises(CheckpointError) as refused:
            compatibility.check_compatible({**saved, **other}, current, str(tmp_path))
        assert "--padded-vocab-size" in str(refused.value)
        assert "release difference" not in str(refused.value)


def test_flags_added_since_a_checkpoint_read_as_it_was_trained():
    """A checkpoint from before --code-tiling, --input-table-rank and --code-projection lacks
    them: it was trained as repeat, without rank or projection, and resumes so."""
    current = saved_args("--input-interface", "gf2")
    old = {k: v for k, v in current.items() if k not in compatibility.ADDED_ARGS}
    compatibility.check_compatible(old, current, "CKPT")
    with pytest.raises(CheckpointError, match="--code-tiling: checkpoint 'repeat', now "
                                              "'recode'"):
        compatibility.check_compatible(old, {**current, "code_tiling": "recode"}, "CKPT")


def test_a_resume_says_the_data_and_tokenizer_it_changed():
    saved = {**saved_args(), "tokenizer_sha256": "a" * 64}
    assert compatibility.changed_on_resume(saved, saved) == []
    changed = compatibility.changed_on_resume(
        saved, {**saved, "seed": 7, "split": "98,1,1", "tokenizer_sha256": "b" * 64})
    assert changed == ["--split: checkpoint '969,30,1', now '98,1,1'",
                       "--seed: checkpoint 1234, now 7",
                       "the tokenizer's files: sha256 aaaaaaaaaaaa... at the checkpoint, now "
                       "bbbbbbbbbbbb..."]
    assert compatibility.changed_on_resume({**saved, "tokenizer_sha256": None},
                                           {**saved, "tokenizer_sha256": "b" * 64}) == []


def test_a_changed_schedule_is_refused_unless_the_flags_say_which_continues():
    saved = saved_args("--lr", "1e-3")
    args = read_training_flags([*TINY_RUN, "--train-iters", "8", "--lr", "2e-3"])
    with pytest.raises(CheckpointError, match=r"schedule differs .*: --lr 0.002 \(checkpoint "
                                              r"0.001\). Pass --override-opt_param-scheduler"):
        compatibility.reconcile_schedule(saved, args, 8, 4, "CKPT")
    args = args.replace(override_opt_param_scheduler=True)
    diffs, kept = compatibility.reconcile_schedule(saved, args, 8, 4, "CKPT")
    assert diffs == ["--lr 0.002 (checkpoint 0.001)"] and kept["lr"] == 2e-3
    args = args.replace(override_opt_param_scheduler=False,
                        use_checkpoint_opt_param_scheduler=True)
    assert compatibility.reconcile_schedule(saved, args, 8, 4, "CKPT")[1]["lr"] == 1e-3
    with pytest.raises(CheckpointError, match="trained at --global-batch-size 4, this run's "
                                              "is 8"):
        compatibility.reconcile_schedule(saved, args, 8, 8, "CKPT")


def _other(value):
    """A value unlike ``value`` (a switch flipped): a resume compares values, whatever their
    type."""
    return not value if isinstance(value, bool) else f"changed from {value!r}"


def _dashed(name: str) -> str:
    return "--" + name.replace("_", "-")


@pytest.mark.parametrize("kind", sorted(RESUME_KINDS))
def test_each_flag_resumes_as_its_field_declares(kind):
    """Every flag of a kind, changed alone since the checkpoint (under WSD, so that every
    schedule flag counts): a model or precision flag is refused naming it, a said one is
    taken and named for the log, a schedule one is a difference of the schedule that the
    flags' values take on with --override-opt_param-scheduler, a free one none of these."""
    saved = saved_args("--lr-decay-style", "WSD")
    config = read_training_flags([*TINY_RUN, "--train-iters", "8", "--lr-decay-style", "WSD"])
    fields = fields_where(resume=kind)
    assert fields
    for concern, field in fields:
        name, value = field.name, _other(saved[field.name])
        current = {**saved, name: value}
        refused = re.escape(f"{_dashed(name)}: checkpoint {saved[name]!r}, now {value!r}")
        if kind in ("model", "precision"):
            with pytest.raises(CheckpointError, match=refused):
                compatibility.check_compatible(saved, current, "CKPT")
            continue
        compatibility.check_compatible(saved, current, "CKPT")
        said = compatibility.changed_on_resume(saved, current)
        assert said == ([f"{_dashed(name)}: checkpoint {saved[name]!r}, now {value!r}"]
                        if kind == "said" else []), name
        changed = config.replace(**{name: value, "override_opt_param_scheduler": True})
        diffs, kept = compatibility.reconcile_schedule(saved, changed, 8, 4, "CKPT")
        if kind == "schedule":
            assert [d.split()[0] for d in diffs][:1] == [concern.spellings(field)[0]], name
            assert kept[name] == value, name
        else:
            assert diffs == [], name


def test_use_checkpoint_args_takes_each_flag_as_its_field_declares(tmp_path):
    """With --use-checkpoint-args, a flag declared ``always`` is the checkpoint's whatever
    the command line says, one declared ``unset_only`` is the checkpoint's where the command
    line leaves it unset and the command line's where given, any other stays as given."""
    import torch
    from megatron.core.dist_checkpointing.core import CheckpointingConfig, save_config
    given = read_training_flags([*TINY_RUN, "--train-iters", "8", "--load", str(tmp_path),
                                 "--use-checkpoint-args"])
    saved = {k: _other(v) for k, v in given.record().items()}
    path = layout.checkpoint_path(str(tmp_path), 3)
    os.makedirs(path)
    torch.save({"args": saved}, os.path.join(path, "common.pt"))  # a save's common objects
    save_config(CheckpointingConfig("torch_dist"), path)
    (tmp_path / MARKER).write_text("3")
    unset_only = {f.name for _, f in fields_where(checkpoint_args="unset_only")}
    unset = given.replace(**dict.fromkeys(unset_only, None))
    for config in (given, unset):
        taken = with_checkpoint_args(config).record()
        for name, value in config.record().items():
            declared = next(f for _, f in fields_where() if f.name == name)
            from_checkpoint = declared.metadata["checkpoint_args"] == "always" or (
                declared.metadata["checkpoint_args"] == "unset_only" and value is None)
            assert taken[name] == (saved[name] if from_checkpoint else value), name
    assert unset_only and {f.name for _, f in fields_where(checkpoint_args="always")}


def test_the_runs_own_saves_are_its_save_directory_however_spelled(tmp_path):
    save = tmp_path / "ckpt"
    save.mkdir()
    (tmp_path / "link").symlink_to(save)
    assert own_saves(str(save), str(save)) and own_saves(f"{tmp_path}/link", str(save))
    assert own_saves(f"{save}/", str(save))
    assert not own_saves(str(tmp_path / "base"), str(save))
    assert not own_saves(None, str(save)) and not own_saves(str(save), None)


def test_a_manifest_lists_each_file_with_its_size_and_a_sound_save_checks_ok(tmp_path):
    path = write_save(tmp_path, 3)
    files = json.loads((tmp_path / "iter_0000003" / manifest.MANIFEST).read_text())["files"]
    assert sorted(files) == ["__0_0.distcp", "common.pt"]
    assert loading.check_save(str(tmp_path)).startswith("ok: ")
    assert files["common.pt"]["size"] == os.path.getsize(os.path.join(path, "common.pt"))
