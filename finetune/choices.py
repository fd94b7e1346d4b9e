"""What a user chooses for training, importable without torch: `specdec serve` builds every subcommand's parser
(this one's included) before it answers the editor's initialize, and torch loads with a run, not before."""

OBJECTIVES = ("distill", "lm", "mixed", "argmax", "tvd")  # specdec_finetune.train's training objectives
