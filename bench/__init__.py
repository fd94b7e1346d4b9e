"""specdec's benchmarks, in one room at the top of the house (installed as specdec_bench): the engine benchmark
(`specdec bench`) and its llama.cpp anchors, the kernel, quality (HumanEval), editor, document, repository-index,
repository and fine-tune benchmarks. They import whatever they measure; nothing imports them."""
