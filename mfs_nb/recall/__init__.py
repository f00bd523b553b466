"""Recall by meaning: what is indexed (`rows`), ranking and fusion (`ranking`), the background writer
(`indexer`), hybrid search (`searcher`), and the model's recall tools (`tools`)."""
