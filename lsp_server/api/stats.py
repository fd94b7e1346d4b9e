"""specdec/stats: the models' state, the scheduler's counters, the index, online adaptation and the metrics."""

from __future__ import annotations

from lsp_server.documents import summary

METHOD = "specdec/stats"


def handle(ls, params=None):
    host = ls.host
    index = ls.indexing.stats()
    return {"model": {"state": host.state, "error": host.error, "target": ls.settings.target,
                      "draft": ls.settings.draft, "strategy": ls.settings.strategy, "adapter": host.adapter,
                      "target_quant": host.target_quant,
                      "adapter_error": host.adapter_error, "progress": host.progress},
            "scheduler": dict(ls.service.counters), "finetune": ls.finetuning.last,
            "repo_index": index if index is not None else {"state": "off"},
            "online_adaptation": ls.service.online.status(), "cost_curve": host.cost_curve(),
            "documents": summary(ls.workspace.text_documents.values()),
            "engine": host.stats() if host.remote else {"kind": "local", "state": "ok"},
            **ls.metrics.summary()}
