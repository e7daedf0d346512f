"""The method (docs/method.md): the objective, its KL estimators and statistics, cross-tokenizer chunk alignment. torch and config only: no I/O."""
