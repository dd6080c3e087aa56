"""Saves and loads of a shard: the files on storage and the two phases around them.

- ``checkpoint``: every save's files and ``MANIFEST.json`` (the PS's only storage I/O);
- ``partfile``: a part file's name and codec (pure);
- ``saving``: writing a shard's save, part by part;
- ``shard_saves``: a shard's saves (now, staged, or taken now and written later);
- ``held_save``: a snapshot save between being taken and being written;
- ``load_plan``, ``shard_loads``: which parts a shard reads, and a shard's loads;
- ``staging``: side effects and swaps pending until every server succeeded.
"""
