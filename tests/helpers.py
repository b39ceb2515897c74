"Helpers shared by the chapters' tests."


def with_metric(rows, metric, by_seed, *, require_metric=False, **match):
    """A copy of `rows` in which every row whose fields equal `match` (fields given as None are not compared) gets
    `metric` = by_seed[row's seed]; with `require_metric`, only rows that already hold the metric. The claim-rule tests
    use it to move one arm's numbers and watch the verdict follow."""
    out = [dict(r) for r in rows]
    for r in out:
        if all(v is None or r.get(k) == v for k, v in match.items()) and (not require_metric or metric in r):
            r[metric] = by_seed[r["seed"]]
    return out
