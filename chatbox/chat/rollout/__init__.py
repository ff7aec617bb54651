"""Model rollout: canaries and their decision rule, shadow traffic, eval suites and
running them, grading live answers, pre-warming, the console's models, and ratings of answers."""
