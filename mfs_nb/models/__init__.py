"""The models: the chat client over litellm with its fallback, the offline default, prompt caching and cost,
the embedders and the bulk encoder, the encoder's child process, the Ray backfill."""
