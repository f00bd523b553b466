"""The command line and what it runs: `mfs-nb` (cli), the demo, replay, imports of transcripts and account
exports, the export, the MCP server."""
