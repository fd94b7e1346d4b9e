"""`python -m specdec_bench.llama_sweep`: each configuration's server gets its own flags (the draft's path filled
in), every hole is sent after its previous keystroke, and the table compares each configuration with the first."""

import json

from specdec_bench import llama_sweep


def test_a_configuration_runs_every_hole_on_a_server_started_with_its_flags(tmp_path):
    from fake_llama_server import executable

    argv_log = tmp_path / "argv.jsonl"
    model = tmp_path / "model.gguf"  # the stand-in's "model" is its config
    model.write_text(json.dumps({"default": [50, 51, 52, 53], "argv_log": str(argv_log)}))
    args = ["-t", "2", *[str(tmp_path / "draft.gguf") if a == llama_sweep.DRAFT else a
                         for a in llama_sweep.CONFIGS["draft-n8-td2"]]]
    prompts = [([1, 2, 3], [1, 2]), ([4, 5, 6], [4, 5])]
    run = llama_sweep.run_config(executable(tmp_path), model, args, prompts, 3, set(), "draft-n8-td2")
    assert not run.failed and run.outputs == [[50, 51, 52], [50, 51, 52]] and len(run.rates) == 2
    assert run.drafted > 0  # the stand-in drafts only under --spec-type, as b11434 does
    logged = [json.loads(line) for line in argv_log.read_text().splitlines()]
    assert any(str(tmp_path / "draft.gguf") in argv and "--spec-draft-n-max" in argv for argv in logged)


def test_the_table_compares_with_the_reference_and_says_a_failure():
    plain = llama_sweep.ConfigRun("plain", rates=[10.0, 20.0, 30.0], outputs=[[1], [2], [3]])
    fast = llama_sweep.ConfigRun("ngram", rates=[20.0, 40.0, 60.0], drafted=10, accepted=5,
                                 outputs=[[1], [2], [9]])
    assert fast.line(plain, 20.0).split() == ["ngram", "40.00", "20.00", "2.00x", "0.50", "67%"]
    assert llama_sweep.ConfigRun("broken", failed="died").line(plain, 20.0).endswith("failed: died")


def test_every_configuration_names_the_draft_only_through_the_placeholder():
    for name, args in llama_sweep.CONFIGS.items():
        assert ("-md" in args) == (llama_sweep.DRAFT in args), name
