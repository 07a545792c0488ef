// What h() and svg() take as children, declared here because a JSDoc @typedef cannot
// refer to itself. Only the type checker reads this file; the server does not serve it.

/**
 * What an element may hold: text (a number is written as text), a node, nothing (null,
 * undefined and false are left out), or a list of those, nested as deep as it comes.
 */
export type Child = Node | string | number | boolean | null | undefined | Child[];
