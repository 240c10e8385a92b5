"""``kvtier cache``: see, verify, bound and clean what a shared fs directory or S3 prefix holds.

* ``records``: what every command reports (``Problems``: a clear line and a counter for each
  thing that is not kvtier's or cannot be read; ``Usage``: one identity's totals);
* ``identity_doc``: what a namespace's ``identity.json`` says (model, revision, layout);
* ``fs_store`` and ``s3_store``: the two layouts, walked and read without following a link
  or deleting anything that is not a chunk of the layout (``Store``);
* ``inventory`` (``ls``, ``du``), ``verify`` and ``gc``: the commands' work, ``progress`` the
  verify progress line; ``duration`` parses ``7d``/``12h``.

The command line is ``kvtier.cli.cache``. Thread safety: see each module.
"""
