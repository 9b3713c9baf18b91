"""Ranking arms, one file each, registered by one line of ``eval.ranking`` (conf/eval/default.yaml).

To add an arm ``myarm``: write ``myarm.py`` here with a class that has ``needs: ClassVar[tuple[str,
...]]`` (the inputs it reads: ``hir``, ``content``, or none) and ``inputs(sources, rows, base) ->
RankerInputs`` (evaluation/ranking/registry.py); usually ``base.with_blocks(dense, vectors, bags)``
with at least one ``has_<name>`` dense column (its coverage). Then add
``myarm: {_target_: hir_evaluation.ranking.arms.myarm.MyArm}`` to ``eval.ranking``.
"""
