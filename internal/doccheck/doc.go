// Package doccheck holds a test, and nothing else: that the lists the
// docs give (the backends, those that record steps or list their records,
// those with a transactional RunOnceTx, the targets the idem command
// opens, the variables the tests read) name what the code has, in every
// package doc, doc comment and README.md sentence that gives one.
package doccheck
