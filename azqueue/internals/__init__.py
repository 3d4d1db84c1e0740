"""What azqueue reads or sets of a library's private parts, where the library offers no
public way: one module per library, each naming the version it was read against and the
test that fails when a release of the library changes what it relies on. Nothing else
in azqueue reaches into a library's private attributes."""
