"""The fine-tune's acceptance measurement (finetune/evaluate.py) has the draft read the prompt as the server's draft
does: the FIM suffix section cut to draft_view.DRAFT_SUFFIX_TOKENS tokens, so a before/after comparison measures
the drafts the server runs."""

import tiny
from specdec.engine.drafters import draft_model
from specdec.engine.drafters.draft_view import DRAFT_SUFFIX_TOKENS, suffix_section
from specdec.prompts import fim
from specdec_finetune.evaluate import holes_for, measure


class File:
    language, path = "python", "a.py"
    text = "".join(f"def scaled_{i}(value):\n    return value * {i} + offset_{i}\n\n" for i in range(12))


def test_the_measured_draft_reads_the_servers_view_of_the_prompt(tok, monkeypatch):
    markers = fim.markers(tok, fim.detect(tok))
    synced = []
    prefill = draft_model.DraftModel.prefill

    def recorded(self, context, should_stop=None):
        synced.append(self.seen(context))
        return prefill(self, context, should_stop)

    monkeypatch.setattr(draft_model.DraftModel, "prefill", recorded)
    holes = holes_for([File()], holes_per_file=2)
    per = measure(tiny.model(seed=0), tiny.model(seed=1), tok, holes, max_new_tokens=6, k=2)
    assert per["total"]["holes"] == 2 and len(synced) == 2
    for context in synced:
        start, end = suffix_section(context, markers)
        assert 0 < end - start <= DRAFT_SUFFIX_TOKENS
