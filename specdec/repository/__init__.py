"""A repository's files as specdec reads them: the one file filter (training and indexing), and the repository
index's builder and its background keeper for an editor's workspace."""
