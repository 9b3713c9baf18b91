"""Retrieval arms, one file each, registered by one line of ``eval.retrieval`` (conf/eval/default.yaml).

To add an arm ``myarm``: write ``myarm.py`` here with a class that has ``info: ClassVar[ArmInfo]``
(evaluation/retrieval/registry.py: role, needs, whether it fits on val, whether it has a masked
list) and ``topk(ctx, k) -> Ranked``; a dense-score arm returns ``rank_dense(scorer, ctx.test.users,
k, ctx.test.seen, deep=ctx.test.seen_deep)`` (evaluation/retrieval/rank.py), which gives every
protocol (full, masked new-to-user, deep funnel); an arm that orders its own lists passes them as
``Ranked(full, masked, fit, deep=...)``. Then add
``myarm: {_target_: hir_evaluation.retrieval.arms.myarm.MyArm, <settings>}`` to ``eval.retrieval``.
``popularity.py`` is the smallest example.
"""
